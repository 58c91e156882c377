"""The numerics of attention over quantized keys and values (kv_forms.Quantized: int8 or fp8 e4m3 codes with an
fp32 scale per token and kv head), never dequantized whole; the quantized backend (quantized.py) runs them.

    kernel_step / quantized_step   the C++ kernel's quantized decode step (decode_quant_step.h): the codes are
        widened in registers and each scale multiplies its key's score and its value's weight; one scale
        per key row, a few query rows per sequence, on the CPU (a custom op under torch.compile)
    blockwise      everything else: BLOCK keys at a time dequantized to fp32 and attended with an online
        softmax, merged by the log-sum-exp, so that a long cache is never dequantized whole
"""
from __future__ import annotations

import torch

from multihead.backends.common import masked_softmax, scored, zero_where
from multihead.backends.merge import merge_states
from multihead.backends.cpu.build import kernel
from multihead.backends.kv_forms import Quantized

BLOCK = 1024  # keys dequantized at a time by the blockwise form


@torch.library.custom_op("multihead::decode_step_quantized", mutates_args=())
def _quantized_op(q: torch.Tensor, key_codes: torch.Tensor, value_codes: torch.Tensor, key_scales: torch.Tensor,
                  value_scales: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, qpos: torch.Tensor,
                  slopes: torch.Tensor, sinks: torch.Tensor, fp8: bool, scale: float, softcap: float) -> torch.Tensor:
    """The C++ kernel's quantized step as a custom op (torch.compile keeps it whole); slopes and sinks empty
    when absent, softcap 0 when absent. Out (B, H, Lq, Dv) float32."""
    kv_dtype = torch.float8_e4m3fn if fp8 else torch.int8
    return kernel_step(kernel(), q, Quantized(key_codes, key_scales, kv_dtype), Quantized(value_codes, value_scales,
                       kv_dtype), lo, hi, qpos, scale, softcap or None, slopes if slopes.numel() else None,
                       sinks if sinks.numel() else None, out_dtype=torch.float32)


@_quantized_op.register_fake
def _(q, key_codes, value_codes, key_scales, value_scales, lo, hi, qpos, slopes, sinks, fp8, scale, softcap):
    return q.new_empty(*q.shape[:3], value_codes.shape[-1], dtype=torch.float32)


def quantized_step(q, keys: Quantized, values: Quantized, lo, hi, qpos, scale: float, softcap, slopes,
                   sinks) -> torch.Tensor:
    """`kernel_step` eager; under torch.compile the same kernel as the custom op multihead::decode_step_quantized
    (once an eager call has loaded it). Out in q's dtype."""
    if not torch.compiler.is_compiling():
        return kernel_step(kernel(), q, keys, values, lo, hi, qpos, scale, softcap, slopes, sinks)
    empty = q.new_empty(0, dtype=torch.float32)
    out = _quantized_op(q, keys.codes, values.codes, keys.scales, values.scales, lo, hi, qpos,
                        empty if slopes is None else slopes, empty if sinks is None else sinks,
                        keys.kv_dtype is torch.float8_e4m3fn, scale, softcap or 0.0)
    return out.to(q.dtype)


def kernel_step(module, q, keys: Quantized, values: Quantized, lo, hi, qpos, scale: float, softcap, slopes,
                sinks, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """The C++ kernel's quantized step (decode_quant_step.h) of a decode_calls.Kernel; out in q's dtype."""
    B, H, Lq, D = q.shape
    Hkv, Dv = keys.codes.shape[1], values.codes.shape[-1]
    ks, vs, ss = keys.codes.stride(), values.codes.stride(), keys.scales.stride()
    if values.scales.stride() != ss or keys.scales.stride(-1) != 1:
        raise ValueError("decode kernel: key and value scales must share one layout, contiguous along the slots")
    qf = q.float().contiguous()
    out = torch.empty(B, H, Lq, Dv, dtype=torch.float32)
    empty = qf.new_empty(0)
    slopes = empty if slopes is None else slopes.float().contiguous()
    sinks = empty if sinks is None else sinks.float().contiguous()
    module.module.decode_step_quantized(
        qf.data_ptr(), keys.codes.data_ptr(), values.codes.data_ptr(), keys.scales.data_ptr(),
        values.scales.data_ptr(), lo.data_ptr(), hi.data_ptr(), qpos.data_ptr(),
        slopes.data_ptr() if slopes.numel() else 0, sinks.data_ptr() if sinks.numel() else 0, out.data_ptr(),
        keys.kv_dtype is torch.float8_e4m3fn, (B, H, Hkv, Lq, D, Dv),
        (ks[0], ks[1], ks[2], vs[0], vs[1], vs[2], ss[0], ss[1]), scale, softcap or 0.0)
    return out.to(out_dtype or q.dtype)


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
