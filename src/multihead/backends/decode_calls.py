"""The compiled decode module's entry points with tensors in and out.

The C++ side (decode_kernel.cpp) takes addresses, sizes and strides, so that it builds without torch's
headers; `Kernel` checks the tensors, lays them out, allocates the output and passes them on:

    kernel.decode_step(q, k, v, lo, hi, qpos, slopes, sinks, scale, softcap) -> (B, H, Lq, Dv) in q's dtype
        q (B, H, Lq, D) float32 or bfloat16, contiguous (a bf16 query meets bf16 keys as it is);
        k (B, Hkv, M, D), v (B, Hkv, M, Dv) float32 or bfloat16 (one dtype), last dim contiguous;
        lo, hi (B, Lq) int64 and qpos (B, Lq) float32, contiguous; slopes and sinks (H,) float32 or
        empty; softcap 0: none.
    kernel.latent_product(w, x, fold) -> (H, M, N) float32
        x (H, M, K) float32, w bfloat16 (H, K, N) to fold or (H, N, K) to unfold, both contiguous.
    kernel.isa() -> the path the build runs: "avx512-bf16", "avx512", "avx2", "portable-neon", ...

Wrong layouts raise ValueError: the callers (decode_step.py, latent_products.py) make them right.
"""
from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.bfloat16)


def _address(t: torch.Tensor | None) -> int:
    """t's data address, 0 for an absent or empty tensor (the C++ side's "none")."""
    return 0 if t is None or t.numel() == 0 else t.data_ptr()


class Kernel:
    """One build of the decode module (decode_build.variant), called with tensors."""

    def __init__(self, module):
        self.module = module
        self.path = module.isa()  # read once: decode_step asks at every call

    def isa(self) -> str:
        return self.path

    def decode_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                    qpos: torch.Tensor, slopes: torch.Tensor, sinks: torch.Tensor, scale: float,
                    softcap: float) -> torch.Tensor:
        if q.dim() != 4 or q.dtype not in DTYPES or not q.is_contiguous() or k.dim() != 4 or v.dim() != 4:
            raise ValueError("decode kernel: q must be a contiguous (B, H, Lq, D) float32 or bfloat16 tensor")
        B, H, Lq, D = q.shape
        Hkv, Dv = k.shape[1], v.shape[-1]
        if k.dtype != v.dtype or k.dtype not in DTYPES or k.stride(-1) != 1 or v.stride(-1) != 1:
            raise ValueError("decode kernel: k and v must share float32 or bfloat16 with a contiguous last dim")
        if Hkv == 0 or H % Hkv or k.shape[-1] != D or k.shape[:3] != v.shape[:3] or k.shape[0] != B:
            raise ValueError(f"decode kernel: q {tuple(q.shape)} does not fit k {tuple(k.shape)}, v {tuple(v.shape)}")
        for name, t, dtype in (("lo", lo, torch.int64), ("hi", hi, torch.int64), ("qpos", qpos, torch.float32)):
            if t.dtype != dtype or t.shape != (B, Lq) or not t.is_contiguous():
                raise ValueError(f"decode kernel: {name} must be a contiguous ({B}, {Lq}) {dtype} tensor")
        for name, t in (("slopes", slopes), ("sinks", sinks)):
            if t.numel() and (t.dtype != torch.float32 or t.shape != (H,) or not t.is_contiguous()):
                raise ValueError(f"decode kernel: {name} must be empty or a contiguous ({H},) float32 tensor")
        bf16_query = q.dtype == torch.bfloat16
        qf = q.float() if bf16_query else q
        out = torch.empty(B, H, Lq, Dv, dtype=torch.float32)
        self.module.decode_step(qf.data_ptr(), q.data_ptr() if bf16_query else 0, k.data_ptr(), v.data_ptr(),
                                lo.data_ptr(), hi.data_ptr(), qpos.data_ptr(), _address(slopes), _address(sinks),
                                out.data_ptr(), k.dtype == torch.bfloat16, (B, H, Hkv, Lq, D, Dv),
                                (*k.stride()[:3], *v.stride()[:3]), scale, softcap)
        return out.to(torch.bfloat16) if bf16_query else out

    def latent_product(self, w: torch.Tensor, x: torch.Tensor, fold: bool) -> torch.Tensor:
        if w.dim() != 3 or x.dim() != 3 or w.shape[0] != x.shape[0]:
            raise ValueError("latent product: w (H, ., .) and x (H, M, K)")
        if w.dtype != torch.bfloat16 or not w.is_contiguous() or x.dtype != torch.float32 or not x.is_contiguous():
            raise ValueError("latent product: w must be contiguous bfloat16 and x contiguous float32")
        H, M, K = x.shape
        N = w.shape[2] if fold else w.shape[1]
        if (w.shape[1] if fold else w.shape[2]) != K:
            raise ValueError(f"latent product: w {tuple(w.shape)} and x {tuple(x.shape)} must share K")
        y = torch.empty(H, M, N, dtype=torch.float32)
        self.module.latent_product(w.data_ptr(), x.data_ptr(), y.data_ptr(), (H, M, K, N), fold)
        return y
