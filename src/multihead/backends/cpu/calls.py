"""The compiled decode module's entry points with tensors in and out.

The C++ side (decode_kernel.cpp) takes addresses, sizes and strides, so that it builds without torch's
headers; `Kernel` checks the tensors, lays them out, allocates the output and passes them on:

    kernel.decode_step(q, k, v, lo, hi, qpos, slopes, sinks, scale, softcap) -> (B, H, Lq, Dv) in q's dtype
        q (B, H, Lq, D) float32 or bfloat16, contiguous (a bf16 query meets bf16 keys as it is);
        k (B, Hkv, M, D), v (B, Hkv, M, Dv) float32 or bfloat16 (one dtype), last dim contiguous;
        lo, hi (B, Lq) int64 and qpos (B, Lq) float32, contiguous; slopes and sinks (H,) float32 or
        empty; softcap 0: none.
    kernel.decode_listed(q, k, v, idx, count, sinks, scale, softcap) -> (B, H, 1, Dv): the same step over the
        distinct cache slots among idx[b, :count[b]] of each row b only, -1 skipped (Mask.sparse's decode step).
    kernel.latent_product(w, x, fold) -> (H, M, N) float32
        x (H, M, K) float32, w bfloat16 (H, K, N) to fold or (H, N, K) to unfold, both contiguous.
    kernel.isa() -> the path the build runs: "avx512-bf16", "avx512", "avx2", "portable-neon", ...

Wrong layouts raise ValueError: the callers (decode_step.py, latent_products.py) make them right.
"""
from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.bfloat16)


def _address(t: torch.Tensor) -> int:
    """t's data address, 0 for an empty tensor (the C++ side's "none")."""
    return t.data_ptr() if t.numel() else 0


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
        # every check reads metadata only (a few microseconds a call)
        B, H, Lq, D, Hkv, Dv = _checked_qkv(q, k, v, sinks)
        rows = B * Lq
        if lo.dtype is not torch.int64 or hi.dtype is not torch.int64 or qpos.dtype is not torch.float32 \
                or lo.numel() != rows or hi.numel() != rows or qpos.numel() != rows \
                or not (lo.is_contiguous() and hi.is_contiguous() and qpos.is_contiguous()):
            raise ValueError(f"decode kernel: lo, hi (int64) and qpos (float32) must be contiguous ({B}, {Lq})")
        if slopes.numel() and (slopes.dtype is not torch.float32 or slopes.numel() != H or not slopes.is_contiguous()):
            raise ValueError(f"decode kernel: slopes must be empty or contiguous ({H},) float32")
        bf16_query = q.dtype is torch.bfloat16
        qf = q.float() if bf16_query else q
        out = torch.empty(B, H, Lq, Dv, dtype=torch.float32)
        ks, vs = k.stride(), v.stride()
        self.module.decode_step(qf.data_ptr(), q.data_ptr() if bf16_query else 0, k.data_ptr(), v.data_ptr(),
                                lo.data_ptr(), hi.data_ptr(), qpos.data_ptr(), _address(slopes), _address(sinks),
                                out.data_ptr(), k.dtype is torch.bfloat16, (B, H, Hkv, Lq, D, Dv),
                                (ks[0], ks[1], ks[2], vs[0], vs[1], vs[2]), scale, softcap)
        return out.to(torch.bfloat16) if bf16_query else out

    def decode_listed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                      count: torch.Tensor | None, sinks: torch.Tensor | None, scale: float,
                      softcap: float) -> torch.Tensor:
        """decode_step over listed rows: q (B, H, 1, D); row b reads the distinct cache slots among idx[b, :count[b]]
        of k and v, in increasing order, -1 (none) and repeats skipped (idx (B, K) and count (B,) int64, contiguous,
        every slot in [-1, M): the caller checked; count None: all K slots; sinks None: none) -> (B, H, 1, Dv)."""
        sinks = _NO_SINKS if sinks is None else sinks
        B, H, Lq, D, Hkv, Dv = _checked_qkv(q, k, v, sinks)
        bad_count = count is not None and (count.dtype is not torch.int64 or count.numel() != B
                                           or not count.is_contiguous())
        if Lq != 1 or idx.dtype is not torch.int64 or idx.dim() != 2 or idx.shape[0] != B or not idx.is_contiguous() \
                or bad_count:
            raise ValueError("decode kernel: listed rows need q (B, H, 1, D), idx (B, K) and count (B,) int64")
        bf16_query = q.dtype is torch.bfloat16
        qf = q.float() if bf16_query else q
        out = torch.empty(B, H, Lq, Dv, dtype=torch.float32)
        ks, vs = k.stride(), v.stride()
        self.module.decode_listed(qf.data_ptr(), q.data_ptr() if bf16_query else 0, k.data_ptr(), v.data_ptr(),
                                  idx.data_ptr(), idx.shape[1], 0 if count is None else count.data_ptr(),
                                  _address(sinks), out.data_ptr(), k.dtype is torch.bfloat16, (B, H, Hkv, Lq, D, Dv),
                                  (ks[0], ks[1], ks[2], vs[0], vs[1], vs[2]), scale, softcap)
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


_NO_SINKS = torch.empty(0)


def _checked_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor):
    """(B, H, Lq, D, Hkv, Dv) once q (B, H, Lq, D), k (B, Hkv, M, D) and v (B, Hkv, M, Dv) fit the kernel (fp32 or
    bf16, k and v alike; q contiguous, k and v contiguous in their last dim) and sinks is empty or (H,) fp32."""
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    if len(q_shape) != 4 or len(k_shape) != 4 or len(v_shape) != 4:
        raise ValueError("decode kernel: q, k and v must be 4-D")
    B, H, Lq, D = q_shape
    Bk, Hkv, M, Dk = k_shape
    if q.dtype not in DTYPES or k.dtype not in DTYPES or v.dtype is not k.dtype:
        raise ValueError("decode kernel: q, k and v must be float32 or bfloat16 (k and v alike)")
    if not q.is_contiguous() or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("decode kernel: q must be contiguous, and k and v contiguous in their last dim")
    if not Hkv or H % Hkv or Dk != D or Bk != B or v_shape[:3] != k_shape[:3]:
        raise ValueError(f"decode kernel: q {tuple(q_shape)} does not fit k {tuple(k_shape)}, v {tuple(v_shape)}")
    if sinks.numel() and (sinks.dtype is not torch.float32 or sinks.numel() != H or not sinks.is_contiguous()):
        raise ValueError(f"decode kernel: sinks must be empty or contiguous ({H},) float32")
    return B, H, Lq, D, Hkv, v_shape[3]
