"""Attention over a quantized KV cache (caches/quantized.py): int8 or fp8 e4m3 codes with an fp32 scale per
token and kv head, never dequantized whole.

    out = quantized_attention(q, keys, values, mask, scale=, softcap=, sinks=)
        q (B, H, Lq, D) float; keys, values: `Quantized` codes (B, Hkv, Lk, D|Dv) with scales (B, Hkv, Lk);
        mask: any Mask over (B, H, Lq, Lk)  ->  out (B, H, Lq, Dv) in q's dtype.

A decode step (at most MAX_ROWS query rows per sequence, on the CPU) runs the C++ kernel's quantized
build (decode_quant.h): the codes are widened in registers and each scale multiplies its key's
score and its value's weight. Everything else (prefill, other devices, no kernel, a latent cache's
rows with two scales, masks that are not one interval of keys per row, such as a Hugging Face 4-D mask)
runs `blockwise`: BLOCK keys at a time are dequantized to fp32 and attended with an online softmax,
so that a long cache is never dequantized whole. Inference only: a query that requires grad is refused.
"""
from __future__ import annotations

import torch

from multihead.backends.common import masked_softmax, recorded_graph, zero_where
from multihead.backends.decode import MAX_ROWS
from multihead.backends.cpu import ops
from multihead.backends.cpu.build import kernel
from multihead.backends.decode_ranges import DecodeRows, key_ranges
from multihead.caches.base import BOTTOM_RIGHT
from multihead.errors import AttentionError
from multihead.masks import Mask
from multihead.caches.codec import Quantized

BLOCK = 1024  # keys dequantized at a time by the blockwise form


def quantized_attention(q: torch.Tensor, keys: Quantized, values: Quantized, mask: Mask | None = None, *,
                        scale: float | None = None, softcap: float | None = None,
                        sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of q (B, H, Lq, D) over a quantized cache's keys and values (see the module docstring)."""
    B, H, Lq, D = q.shape
    Hkv, Lk = keys.codes.shape[1], keys.codes.shape[2]
    if q.requires_grad and torch.is_grad_enabled():
        raise AttentionError("attention over a quantized KV cache is for inference: it has no backward; got a "
                             "query that requires grad (run under torch.no_grad()).")
    if not q.is_floating_point() or keys.codes.shape[-1] != D or H % Hkv:
        raise AttentionError(f"a quantized cache of keys {tuple(keys.codes.shape)} takes float queries (B, H, Lq, "
                             f"{D}) with H a multiple of {Hkv}; got {q.dtype} {tuple(q.shape)}.")
    scale = D ** -0.5 if scale is None else scale
    if mask is not None and mask is not BOTTOM_RIGHT and not mask.normal_form().intervals_only:
        full = _ranges(None, B, H, Lq, Lk, q.device)  # every key; the dense mask decides
        dense = mask.materialize(B, H, Lq, Lk, device=q.device)  # (keep, bias), each (B|1, H|1, Lq, Lk) or None
        return blockwise(q, keys, values, full.lo, full.hi, full.qpos, scale, softcap, None, sinks, dense=dense)
    lo, hi, qpos, slopes = _ranges(mask, B, H, Lq, Lk, q.device)
    eager = not (torch.compiler.is_compiling() or recorded_graph())  # a raw kernel call is not recorded
    module = kernel() if q.device.type == "cpu" and eager else None
    whole_rows = keys.split is None and values.split is None  # the kernel takes one scale per row
    if module is not None and Lq <= MAX_ROWS and whole_rows and keys.codes.stride(-1) == 1 \
            and values.codes.stride(-1) == 1:
        return kernel_step(module, q, keys, values, lo, hi, qpos, scale, softcap, slopes, sinks)
    return blockwise(q, keys, values, lo, hi, qpos, scale, softcap, slopes, sinks)


def _ranges(mask: Mask | None, B: int, H: int, Lq: int, Lk: int, device) -> DecodeRows:
    """key_ranges, made directly for the mask a cache of equal lengths returns (bottom-right causal):
    the normal form's index costs about 0.2 ms a step, a tenth of a step at 16k keys."""
    if mask is not BOTTOM_RIGHT:
        return key_ranges(mask, B, H, Lq, Lk, device)
    hi = (torch.arange(Lk - Lq + 1, Lk + 1, device=device)).expand(B, Lq).contiguous()  # (B, Lq)
    return DecodeRows(torch.zeros_like(hi), hi, torch.zeros(B, Lq, device=device), None)


def kernel_step(module, q, keys: Quantized, values: Quantized, lo, hi, qpos, scale: float, softcap, slopes,
                sinks) -> torch.Tensor:
    """The C++ kernel's quantized step (Kernel.decode_quantized) of a cpu.calls.Kernel; out in q's dtype."""
    empty = q.new_empty(0, dtype=torch.float32)
    slopes = empty if slopes is None else slopes.float().contiguous()
    sinks = empty if sinks is None else sinks.float().contiguous()
    q = q if q.dtype in (torch.float32, torch.bfloat16) else q.float()
    fp8 = keys.kv_dtype is torch.float8_e4m3fn  # codes stored as their bytes (uint8): the kernel reads e4m3
    kc, vc = (t.view(torch.float8_e4m3fn) if fp8 else t for t in (keys.codes, values.codes))
    out, _ = ops.call("decode_quantized", q.contiguous(), kc, vc, keys.scales, values.scales, lo,
                      hi, qpos, slopes, sinks, scale, softcap or 0.0, False, build=module)
    return out.to(q.dtype)


def blockwise(q, keys: Quantized, values: Quantized, lo, hi, qpos, scale: float, softcap=None, slopes=None,
              sinks=None, block: int = BLOCK, dense=None) -> torch.Tensor:
    """The same attention in torch ops, `block` keys at a time dequantized to fp32, merged by their
    log-sum-exp; rows that keep no key give exactly 0. dense: a mask's (keep, bias) (Mask.materialize),
    sliced block by block, for masks that are not intervals. Out (B, H, Lq, Dv) in q's dtype."""
    B, H, Lq, D = q.shape
    Hkv, Lk, Dv = keys.codes.shape[1], keys.codes.shape[2], values.codes.shape[-1]
    G = H // Hkv
    rows = q.float().reshape(B, Hkv, G * Lq, D)  # (B, Hkv, R, D): row r = (query head g, query i)
    out = q.new_zeros(B, Hkv, G, Lq, Dv, dtype=torch.float32)
    lse = q.new_full((B, Hkv, G, Lq, 1), float("-inf"), dtype=torch.float32)
    for j0 in range(0, Lk, block):
        j1 = min(j0 + block, Lk)
        k = keys.slots(j0, j1).numbers()  # (B, Hkv, n, D) fp32
        v = values.slots(j0, j1).numbers()  # (B, Hkv, n, Dv)
        scores = (rows @ k.transpose(-1, -2) * scale).view(B, Hkv, G, Lq, j1 - j0)
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        j = torch.arange(j0, j1, device=q.device)
        if slopes is not None:
            scores = scores + slopes.view(1, Hkv, G, 1, 1) * (j - qpos[:, None, None, :, None])
        keep = ((j >= lo[..., None]) & (j < hi[..., None]))[:, None, None]  # (B, 1, 1, Lq, n)
        if dense is not None:
            part_keep, part_bias = (None if t is None else _heads(t[..., j0:j1], Hkv) for t in dense)
            keep = keep if part_keep is None else keep & part_keep
            if part_bias is not None:  # a bias of -inf blocks its key (a row of them gives 0, not NaN)
                keep, scores = keep & (part_bias > float("-inf")), scores + part_bias
        weights, part = masked_softmax(scores, keep, with_lse=True)
        v = zero_where(~keep.any(2).any(2)[..., None], v)  # keys no row keeps (padding): NaN there stays out
        part = part[..., None]  # (B, Hkv, G, Lq, 1)
        merged = torch.logaddexp(lse, part)
        out = _weigh(out, lse, merged) + _weigh(weights @ v[:, :, None], part, merged)
        lse = merged
    if sinks is not None:  # a sink joins each row's denominator and carries no value
        merged = torch.logaddexp(lse, sinks.float().view(1, Hkv, G, 1, 1))
        out = _weigh(out, lse, merged)
    return out.view(B, H, Lq, Dv).to(q.dtype)


def _heads(t: torch.Tensor, Hkv: int) -> torch.Tensor:
    """t (B|1, H|1, Lq, n) as (B|1, Hkv|1, G|1, Lq, n): query head h = (kv head, g), as the rows are grouped."""
    if t.shape[1] == 1:
        return t[:, :, None]
    return t.unflatten(1, (Hkv, t.shape[1] // Hkv))


def _weigh(out: torch.Tensor, lse: torch.Tensor, merged: torch.Tensor) -> torch.Tensor:
    """out times exp(lse - merged), 0 where lse is -inf (no key so far: never NaN from -inf - -inf)."""
    return torch.where(lse == float("-inf"), 0.0, out * torch.exp(lse - merged))
