"""The compiled decode module's entry points with tensors in and out: the ONE checked wrapper every call goes through.

The C++ side (decode_kernel.cpp) takes addresses, sizes and strides, so that it builds without torch's
headers; `Kernel` checks the tensors (metadata only: a few microseconds), lays them out, allocates the
outputs and passes them on. Shapes: B batch, H query heads, Hkv kv heads, Lq new rows, M cache slots,
P pages, S page size.

    kernel.decode_step(q, k, v, lo, hi, qpos, slopes, sinks, scale, softcap, with_lse=False)
        q (B, H, Lq, D) float32 or bfloat16 (a bf16 query meets bf16 keys as it is); k (B, Hkv, M, D),
        v (B, Hkv, M, Dv) float32 or bfloat16 (one dtype), last dim contiguous; lo, hi (B, Lq) int64 and
        qpos (B, Lq) float32, contiguous: row (b, i) keeps keys lo <= j < hi; slopes and sinks (H,) float32
        or empty; softcap 0: none  ->  out (B, H, Lq, Dv) in q's dtype, and lse (B, H, Lq) float32 if asked.
    kernel.decode_quantized(q, k, v, k_scales, v_scales, lo, hi, qpos, slopes, sinks, scale, softcap, with_lse=False)
        the same over codes: k, v int8 or float8_e4m3fn (B, Hkv, M, .), scales (B, Hkv, M) float32 (one
        layout for both, contiguous along the slots).
    kernel.decode_paged(q, k_pages, v_pages, table, lo, hi, qpos, slopes, sinks, scale, softcap,
                        k_scales=None, v_scales=None, with_lse=False)
        the same over pages read in place: k_pages (P, Hkv, S, D), v_pages (P, Hkv, S, Dv) float32,
        bfloat16, or int8 / float8_e4m3fn codes with scales (P, Hkv, S) float32; table (B, pages) int32,
        -1: no page (its keys count as masked); hi <= pages * S.
    kernel.decode_listed(q, k, v, idx, count, sinks, scale, softcap) -> (B, H, 1, Dv): the step over the
        distinct cache slots among idx[b, :count[b]] of each row b only, -1 skipped (Mask.sparse's decode step).
    kernel.latent_product(w, x, fold) -> (H, M, N) float32
        x (H, M, K) float32, w bfloat16 (H, K, N) to fold or (H, N, K) to unfold, both contiguous.
    kernel.keep_nan_rows(out, q) -> out, with NaN rows where q's row holds NaN or inf (in place)
        q (B, H, L, D) and out (B, H, L, Dv) float32 or bfloat16 alike, q's last dim and out contiguous.
    kernel.isa() -> the path the build runs: "avx512-bf16", "avx512", "avx2", "portable-neon", ...

lse is each row's log-sum-exp (natural log, sinks included), -inf where the row keeps no key (its out is
exactly 0). Wrong layouts raise ValueError: the callers make them right. The custom ops of cpu/ops.py call
these methods.
"""
from __future__ import annotations

import torch

DTYPES = (torch.float32, torch.bfloat16)
KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2, torch.float8_e4m3fn: 3}  # decode_kernel.cpp's Kind
CODES = (torch.int8, torch.float8_e4m3fn)


def _address(t: torch.Tensor | None) -> int:
    """t's data address, 0 for None or an empty tensor (the C++ side's "none")."""
    return t.data_ptr() if t is not None and t.numel() else 0


class Kernel:
    """One build of the decode module (build.variant), called with tensors."""

    def __init__(self, module):
        self.module = module
        self.path = module.isa()  # read once: decode_step asks at every call

    def isa(self) -> str:
        return self.path

    def decode_step(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                    qpos: torch.Tensor, slopes: torch.Tensor, sinks: torch.Tensor, scale: float, softcap: float,
                    with_lse: bool = False):
        return self._step(self.module.decode_step, (), q, k, v, None, None, lo, hi, qpos, slopes, sinks, scale,
                          softcap, with_lse, DTYPES)

    def decode_quantized(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scales: torch.Tensor,
                         v_scales: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, qpos: torch.Tensor,
                         slopes: torch.Tensor, sinks: torch.Tensor, scale: float, softcap: float,
                         with_lse: bool = False):
        return self._step(self.module.decode_step, (), q, k, v, k_scales, v_scales, lo, hi, qpos, slopes, sinks,
                          scale, softcap, with_lse, CODES)

    def decode_paged(self, q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, table: torch.Tensor,
                     lo: torch.Tensor, hi: torch.Tensor, qpos: torch.Tensor, slopes: torch.Tensor,
                     sinks: torch.Tensor, scale: float, softcap: float, k_scales: torch.Tensor | None = None,
                     v_scales: torch.Tensor | None = None, with_lse: bool = False):
        if table.dtype is not torch.int32 or table.dim() != 2 or table.shape[0] != q.shape[0] \
                or not table.is_contiguous():
            raise ValueError(f"decode kernel: the block table must be contiguous ({q.shape[0]}, pages) int32")
        kinds = CODES if k_scales is not None else DTYPES
        return self._step(self.module.decode_paged, (table.data_ptr(), table.shape[1], k_pages.shape[2]), q,
                          k_pages, v_pages, k_scales, v_scales, lo, hi, qpos, slopes, sinks, scale, softcap,
                          with_lse, kinds, pages=True)

    def _step(self, entry, extra: tuple, q, k, v, k_scales, v_scales, lo, hi, qpos, slopes, sinks, scale: float,
              softcap: float, with_lse: bool, kinds: tuple, pages: bool = False):
        """The checks and the call that decode_step, decode_quantized and decode_paged share."""
        B, H, Lq, D, Hkv, Dv = _checked_qkv(q, k, v, sinks, kinds, batch=not pages)
        rows = B * Lq
        if lo.dtype is not torch.int64 or hi.dtype is not torch.int64 or qpos.dtype is not torch.float32 \
                or lo.numel() != rows or hi.numel() != rows or qpos.numel() != rows \
                or not (lo.is_contiguous() and hi.is_contiguous() and qpos.is_contiguous()):
            raise ValueError(f"decode kernel: lo, hi (int64) and qpos (float32) must be contiguous ({B}, {Lq})")
        if slopes.numel() and (slopes.dtype is not torch.float32 or slopes.numel() != H or not slopes.is_contiguous()):
            raise ValueError(f"decode kernel: slopes must be empty or contiguous ({H},) float32")
        codes = k.dtype in CODES
        if codes:
            ss = _checked_scales(k, k_scales, v_scales)
        elif k_scales is not None or v_scales is not None:
            raise ValueError("decode kernel: scales come with int8 or float8_e4m3fn codes only")
        bf16_query = q.dtype is torch.bfloat16
        qf = q.float() if bf16_query else q
        out = torch.empty(B, H, Lq, Dv, dtype=torch.float32)
        lse = torch.empty(B, H, Lq, dtype=torch.float32) if with_lse else None
        ks, vs = k.stride(), v.stride()
        step = self.module.Step(qf.data_ptr(), q.data_ptr() if bf16_query and k.dtype is torch.bfloat16 else 0,
                                k.data_ptr(), v.data_ptr(), _address(k_scales), _address(v_scales), lo.data_ptr(),
                                hi.data_ptr(), qpos.data_ptr(), _address(slopes), _address(sinks), out.data_ptr(),
                                _address(lse))
        strides = (ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], *(ss if codes else (0, 0)))
        entry(step, *extra, KINDS[k.dtype], (B, H, Hkv, Lq, D, Dv), strides, scale, softcap)
        out = out.to(torch.bfloat16) if bf16_query else out
        return (out, lse) if with_lse else out

    def decode_listed(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor,
                      count: torch.Tensor | None, sinks: torch.Tensor | None, scale: float,
                      softcap: float) -> torch.Tensor:
        """decode_step over listed rows: q (B, H, 1, D); row b reads the distinct cache slots among idx[b, :count[b]]
        of k and v, in increasing order, -1 (none) and repeats skipped (idx (B, K) and count (B,) int64, contiguous,
        every slot in [-1, M): the caller checked; count None: all K slots; sinks None: none) -> (B, H, 1, Dv)."""
        sinks = _NO_SINKS if sinks is None else sinks
        B, H, Lq, D, Hkv, Dv = _checked_qkv(q, k, v, sinks, DTYPES)
        bad_count = count is not None and (count.dtype is not torch.int64 or count.numel() != B
                                           or not count.is_contiguous())
        if Lq != 1 or idx.dtype is not torch.int64 or idx.dim() != 2 or idx.shape[0] != B or not idx.is_contiguous() \
                or bad_count:
            raise ValueError("decode kernel: listed rows need q (B, H, 1, D), idx (B, K) and count (B,) int64")
        bf16_query = q.dtype is torch.bfloat16
        qf = q.float() if bf16_query else q
        out = torch.empty(B, H, Lq, Dv, dtype=torch.float32)
        ks, vs = k.stride(), v.stride()
        step = self.module.Step(qf.data_ptr(), q.data_ptr() if bf16_query and k.dtype is torch.bfloat16 else 0,
                                k.data_ptr(), v.data_ptr(), 0, 0, 0, _address(count), 0, 0, _address(sinks),
                                out.data_ptr(), 0)
        self.module.decode_listed(step, idx.data_ptr(), idx.shape[1], KINDS[k.dtype], (B, H, Hkv, Lq, D, Dv),
                                  (ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], 0, 0), scale, softcap)
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

    def keep_nan_rows(self, out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        if q.dim() != 4 or out.dim() != 4 or out.shape[:3] != q.shape[:3] or q.dtype not in DTYPES \
                or out.dtype is not q.dtype or q.stride(3) != 1 or not out.is_contiguous():
            raise ValueError("keep_nan_rows: q (B, H, L, D) and out (B, H, L, Dv) of one dtype (float32 or "
                             "bfloat16), q's last dim and out contiguous")
        B, H, L, D = q.shape
        sb, sh, sl, _ = q.stride()
        self.module.keep_nan_rows(q.data_ptr(), out.data_ptr(), B, H, L, D, out.shape[3], sb, sh, sl,
                                  q.dtype is torch.bfloat16)
        return out


_NO_SINKS = torch.empty(0)


def _checked_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, kinds: tuple,
                 batch: bool = True):
    """(B, H, Lq, D, Hkv, Dv) once q (B, H, Lq, D), k (B, Hkv, M, D) and v (B, Hkv, M, Dv) fit the kernel (q fp32
    or bf16, k and v of one dtype among `kinds`; q contiguous, k and v contiguous in their last dim) and sinks is
    empty or (H,) fp32. batch False: k and v are pages (P, Hkv, S, .), P free."""
    q_shape, k_shape, v_shape = q.shape, k.shape, v.shape
    if len(q_shape) != 4 or len(k_shape) != 4 or len(v_shape) != 4:
        raise ValueError("decode kernel: q, k and v must be 4-D")
    B, H, Lq, D = q_shape
    Bk, Hkv, M, Dk = k_shape
    if q.dtype not in DTYPES or k.dtype not in kinds or v.dtype is not k.dtype:
        raise ValueError(f"decode kernel: q must be float32 or bfloat16 and k, v one of {kinds}, alike; "
                         f"got {q.dtype}, {k.dtype}, {v.dtype}")
    if not q.is_contiguous() or k.stride(3) != 1 or v.stride(3) != 1:
        raise ValueError("decode kernel: q must be contiguous, and k and v contiguous in their last dim")
    if not Hkv or H % Hkv or Dk != D or (batch and Bk != B) or v_shape[:3] != k_shape[:3]:
        raise ValueError(f"decode kernel: q {tuple(q_shape)} does not fit k {tuple(k_shape)}, v {tuple(v_shape)}")
    if sinks.numel() and (sinks.dtype is not torch.float32 or sinks.numel() != H or not sinks.is_contiguous()):
        raise ValueError(f"decode kernel: sinks must be empty or contiguous ({H},) float32")
    return B, H, Lq, D, Hkv, v_shape[3]


def _checked_scales(k: torch.Tensor, k_scales: torch.Tensor | None, v_scales: torch.Tensor | None):
    """The scales' strides along k's first two dims once k_scales and v_scales are float32 k.shape[:3] with one
    layout, contiguous along the slots."""
    if k_scales is None or v_scales is None or k_scales.dtype is not torch.float32 \
            or v_scales.dtype is not torch.float32 or k_scales.shape != k.shape[:3] or v_scales.shape != k.shape[:3] \
            or k_scales.stride() != v_scales.stride() or k_scales.stride(-1) != 1:
        raise ValueError(f"decode kernel: codes need key and value scales {tuple(k.shape[:3])} float32 of one "
                         "layout, contiguous along the slots")
    return k_scales.stride(0), k_scales.stride(1)
