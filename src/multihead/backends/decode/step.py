"""One decode step (a few query rows per sequence against a KV cache): the C++ kernel, or plain torch.

    out = decode_step(q, k, v, lo, hi, qpos, scale, softcap, slopes, sinks)
        q (B, H, Lq, D), k (B, Hkv, M, D), v (B, Hkv, M, Dv) in float32 or bfloat16 (k, v: a KVCache's
        buffers, last dim contiguous); lo, hi (B, Lq) int64: query i of sequence b keeps keys
        lo <= j < hi; qpos (B, Lq) float32: the query position ALiBi measures from; slopes (H,) or
        None; sinks (H,) or None; softcap float or None  ->  out (B, H, Lq, Dv) in q's dtype.

Keys at or past max(hi) of a sequence are never read. Rows that keep no key give exactly 0; NaN in a
query or in a kept key or value propagates. The softmax runs in float32.

The decode backend (decode.py) turns a mask's normal form into (lo, hi, qpos, slopes).
The C++ kernel is a registered custom op (`multihead::decode_step`, cpu/ops.py), so it also runs under
torch.compile once an eager call has loaded it. Without it, `plain_decode_step` computes
the same with torch ops; so it does where that form measured faster for the build's ISA and the dtype
(cpu/choice.py). `describe_step` says which form runs and why.
"""
from __future__ import annotations

import torch

from multihead.backends.common import masked_softmax, scored
from multihead.backends.cpu import ops
from multihead.backends.cpu.build import kernel, loaded, unavailable
from multihead.backends.cpu.choice import KERNEL, faster_form


def decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                qpos: torch.Tensor, scale: float, softcap: float | None = None, slopes: torch.Tensor | None = None,
                sinks: torch.Tensor | None = None, use_kernel: bool = True, with_lse: bool = False):
    """One decode step (see the module docstring); the C++ kernel when built and `use_kernel`. with_lse:
    (out, lse (B, H, Lq) float32), -inf for a row that keeps no key.

    Under torch.compile the kernel runs (as the custom op) if an eager call loaded it already (loading
    reads files). Eager calls go to the compiled module directly: the custom op's dispatch costs about
    0.1 ms a step when the step's keys and values have pushed torch's own code out of the caches."""
    compiling = torch.compiler.is_compiling()
    module = loaded() if compiling else kernel()
    if not use_kernel or module is None or faster_form(module.isa(), q.dtype) != KERNEL:
        return plain_decode_step(q, k, v, lo, hi, qpos, scale, softcap, slopes, sinks, with_lse)
    empty = q.new_empty(0, dtype=torch.float32)
    kept = q.dtype in (torch.float32, torch.bfloat16)  # the kernel takes a bf16 query as it is
    out, lse = ops.call("decode_step", (q if kept else q.float()).contiguous(), k, v, lo, hi, qpos,
                        empty if slopes is None else slopes.float().contiguous(),
                        empty if sinks is None else sinks.float().contiguous(), scale, softcap or 0.0, with_lse)
    return (out.to(q.dtype), lse) if with_lse else out.to(q.dtype)


def kernel_build(dtype: torch.dtype) -> str | None:
    """The ISA of the C++ kernel build `decode_step` runs for `dtype` on this CPU; None: the plain-torch form."""
    module = kernel()
    return module.isa() if module is not None and faster_form(module.isa(), dtype) == KERNEL else None


def describe_step(dtype: torch.dtype, rows: str) -> str:
    """Which form `decode_step` runs for `dtype` on this CPU, and why; `rows` says what each key serves."""
    isa = kernel_build(dtype)
    if isa is not None:
        return (f"C++ decode kernel ({isa} build): one pass over each kv head's keys and values, online "
                f"softmax in fp32; {rows}")
    plain = f"plain torch (K @ q^T, softmax in fp32, p @ V; {rows})"
    module = kernel()
    if module is None:
        return f"{plain}, since {unavailable()}"
    return f"{plain}: measured faster than the C++ decode kernel's {module.isa()} build on this CPU"


def plain_decode_step(q, k, v, lo, hi, qpos, scale: float, softcap=None, slopes=None, sinks=None,
                      with_lse: bool = False):
    """The same step in torch ops: scores as K @ q^T made (rows, keys) contiguous, the reference masked softmax
    (common.py) in float32, p @ V.

    Reads keys up to the longest row's hi; slots past a row's range are zeroed first, so NaN stored
    there never reaches the output. with_lse: (out, lse (B, H, Lq) float32).
    """
    B, H, Lq, D = q.shape
    Hkv, G = k.shape[1], H // k.shape[1]
    compiling = torch.compiler.is_compiling()
    if not compiling and hi.numel():  # eager: read only up to the longest row's keys (one host read)
        top = int(hi.max())
        k, v = k[:, :, :top], v[:, :, :top]
    N = k.shape[2]
    j = torch.arange(N, device=q.device)
    keep = (j >= lo[..., None]) & (j < hi[..., None])  # (B, Lq, N)
    seen = keep.any(dim=1)[:, None, :, None]  # (B, 1, N, 1): keys some row keeps
    if compiling or not bool(seen.all()):
        k, v = torch.where(seen, k, 0), torch.where(seen, v, 0)
    rows = q.reshape(B, Hkv, G * Lq, D)  # (B, Hkv, R, D): row r = (query head g, query i)
    bias = None if slopes is None else slopes.view(1, Hkv, G, 1, 1) * (j - qpos[:, None, None, :, None])
    products = (k @ rows.transpose(-1, -2)).transpose(-1, -2).contiguous()  # (B, Hkv, R, N)
    scores = scored(products.view(B, Hkv, G, Lq, N), scale, softcap, bias)
    kept = keep[:, None, None]  # (B, 1, 1, Lq, N)
    sink = None if sinks is None else sinks.float().view(1, Hkv, G, 1, 1)
    weights = masked_softmax(scores, kept, sink, with_lse)  # rows with no key: exactly 0 (not NaN)
    if with_lse:
        weights, lse = weights
    out = weights.view(B, Hkv, G * Lq, N).to(v.dtype) @ v  # (B, Hkv, R, Dv)
    out = out.view(B, H, Lq, v.shape[-1]).to(q.dtype)
    return (out, lse.reshape(B, H, Lq)) if with_lse else out
