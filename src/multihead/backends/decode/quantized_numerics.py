"""The numerics of attention over quantized keys and values (kv_forms.Quantized: int8 or fp8 e4m3 codes with an
fp32 scale per token and kv head), never dequantized whole; the quantized backend (quantized.py) runs them.

    kernel_step    the C++ kernel's quantized decode step (Kernel.decode_quantized, decode_quant.h): the codes are
        widened in registers and each scale multiplies its key's score and its value's weight;
        one scale per key row, a few query rows per sequence, on the CPU (its custom op under torch.compile)
    blockwise      everything else: BLOCK keys at a time dequantized to fp32 and attended with an online
        softmax, merged by the log-sum-exp, so that a long cache is never dequantized whole
"""
from __future__ import annotations

import torch

from multihead.backends.common import masked_softmax, scored, zero_where
from multihead.backends.cpu import ops
from multihead.backends.kv_forms import Quantized
from multihead.backends.merge import merge_states

BLOCK = 1024  # keys dequantized at a time by the blockwise form


def kernel_step(module, q, keys: Quantized, values: Quantized, lo, hi, qpos, scale: float, softcap, slopes,
                sinks, with_lse: bool = False):
    """The C++ kernel's quantized step (Kernel.decode_quantized) of a cpu.calls.Kernel (None: the loaded build; under
    torch.compile its custom op); out in q's dtype, and with_lse its log-sum-exp (B, H, Lq) float32."""
    empty = q.new_empty(0, dtype=torch.float32)
    slopes = empty if slopes is None else slopes.float().contiguous()
    sinks = empty if sinks is None else sinks.float().contiguous()
    q = q if q.dtype in (torch.float32, torch.bfloat16) else q.float()
    fp8 = keys.kv_dtype is torch.float8_e4m3fn  # codes stored as their bytes (uint8): the kernel reads e4m3
    kc, vc = (t.view(torch.float8_e4m3fn) if fp8 else t for t in (keys.codes, values.codes))
    out, lse = ops.call("decode_quantized", q.contiguous(), kc, vc, keys.scales, values.scales, lo,
                        hi, qpos, slopes, sinks, scale, softcap or 0.0, with_lse, build=module)
    return (out.to(q.dtype), lse) if with_lse else out.to(q.dtype)


def blockwise(q, keys: Quantized, values: Quantized, lo, hi, qpos, scale: float, softcap=None, slopes=None,
              sinks=None, block: int = BLOCK, dense=None, with_lse: bool = False):
    """The same attention in torch ops, `block` keys at a time dequantized to fp32, merged by their
    log-sum-exp; rows that keep no key give exactly 0. dense: a mask's (keep, bias) (Mask.materialize),
    sliced block by block, for masks that are not intervals. Out (B, H, Lq, Dv) in q's dtype; with_lse:
    (out, lse (B, H, Lq) float32)."""
    B, H, Lq, D = q.shape
    Hkv, Lk, Dv = keys.codes.shape[1], keys.codes.shape[2], values.codes.shape[-1]
    G = H // Hkv
    rows = q.float().reshape(B, Hkv, G * Lq, D)  # (B, Hkv, R, D): row r = (query head g, query i)
    out = q.new_zeros(B, H, Lq, Dv, dtype=torch.float32)
    lse = q.new_full((B, H, Lq), float("-inf"), dtype=torch.float32)
    for j0 in range(0, Lk, block):
        j1 = min(j0 + block, Lk)
        k = keys.slots(j0, j1).numbers()  # (B, Hkv, n, D) fp32
        v = values.slots(j0, j1).numbers()  # (B, Hkv, n, Dv)
        j = torch.arange(j0, j1, device=q.device)
        bias = None if slopes is None else slopes.view(1, Hkv, G, 1, 1) * (j - qpos[:, None, None, :, None])
        keep = ((j >= lo[..., None]) & (j < hi[..., None]))[:, None, None]  # (B, 1, 1, Lq, n)
        if dense is not None:
            part_keep, part_bias = (None if t is None else _heads(t[..., j0:j1], Hkv) for t in dense)
            keep = keep if part_keep is None else keep & part_keep
            if part_bias is not None:  # a bias of -inf blocks its key (a row of them gives 0, not NaN)
                keep, bias = keep & (part_bias > float("-inf")), part_bias if bias is None else bias + part_bias
        scores = scored((rows @ k.transpose(-1, -2)).view(B, Hkv, G, Lq, j1 - j0), scale, softcap, bias)
        weights, part = masked_softmax(scores, keep, with_lse=True)
        v = zero_where(~keep.any(2).any(2)[..., None], v)  # keys no row keeps (padding): NaN there stays out
        block_out = (weights @ v[:, :, None]).view(B, H, Lq, Dv)
        out, lse = merge_states([(out, lse), (block_out, part.view(B, H, Lq))])
    if sinks is not None:  # a sink joins each row's denominator and carries no value: a state of zeros
        out, lse = merge_states([(out, lse), (torch.zeros_like(out), sinks.float().view(1, H, 1).expand_as(lse))])
    out = out.to(q.dtype)
    return (out, lse) if with_lse else out


def _heads(t: torch.Tensor, Hkv: int) -> torch.Tensor:
    """t (B|1, H|1, Lq, n) as (B|1, Hkv|1, G|1, Lq, n): query head h = (kv head, g), as the rows are grouped."""
    if t.shape[1] == 1:
        return t[:, :, None]
    return t.unflatten(1, (Hkv, t.shape[1] // Hkv))
