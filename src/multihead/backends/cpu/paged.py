"""The decode step over a paged KV cache, read in place through its block table: the C++ kernel, or plain torch.

    out = decode_paged(q, key_pages, value_pages, block_table, lengths, *, scale, sinks=None, softcap=None,
                       key_scales=None, value_scales=None, window=None, return_lse=False)
        q (B, H, Lq, D) float32 or bfloat16: each sequence's Lq newest tokens (their keys stored already);
        key_pages (P, Hkv, S, D), value_pages (P, Hkv, S, Dv): float32 or bfloat16, or int8 / float8_e4m3fn
        codes with key_scales, value_scales (P, Hkv, S) float32 (value = code * scale); block_table (B, n)
        int32: token t of sequence b is slot t % S of page block_table[b, t // S], -1 = no page (its keys
        count as masked); lengths (B,) int64 tokens per sequence (at most n * S); sinks (H,); softcap float;
        window: each row keeps its `window` newest keys only  ->  out (B, H, Lq, Dv) in q's dtype, and with
        return_lse lse (B, H, Lq) float32.

Row i of sequence b is causal from the bottom right: it keeps keys j < lengths[b] - Lq + 1 + i (and
j >= that - window). lse is the natural log of each row's softmax denominator over the scaled, capped
scores, sinks included; -inf for a row that keeps no key (its out is exactly 0), so that a cascade can
merge a shared prefix with each sequence's suffix (merge_states). The G = H / Hkv query heads of a kv head
share one pass over its pages. Without the kernel (no compiler, MULTIHEAD_DECODE_KERNEL=0) or under
torch.compile before an eager call loaded it, `plain_paged` computes the same with torch ops (it gathers
the pages: the kernel never does).
"""
from __future__ import annotations

import torch

from multihead.backends.cpu import ops
from multihead.backends.cpu.build import kernel, loaded
from multihead.backends.cpu.calls import CODES, DTYPES
from multihead.errors import AttentionError

_EMPTY = torch.empty(0)


def decode_paged(q: torch.Tensor, key_pages: torch.Tensor, value_pages: torch.Tensor, block_table: torch.Tensor,
                 lengths: torch.Tensor, *, scale: float, sinks: torch.Tensor | None = None,
                 softcap: float | None = None, key_scales: torch.Tensor | None = None,
                 value_scales: torch.Tensor | None = None, window: int | None = None, return_lse: bool = False):
    """One decode step over pages (see the module docstring): out, or (out, lse) with return_lse."""
    _check(q, key_pages, value_pages, block_table, lengths, sinks, key_scales, value_scales, window)
    lo, hi = rows_kept(lengths, q.shape[2], window)
    compiling = torch.compiler.is_compiling()
    module = loaded() if compiling else kernel()
    if module is None or q.device.type != "cpu":
        out, lse = plain_paged(q, key_pages, value_pages, block_table, lo, hi, scale, sinks, softcap, key_scales,
                               value_scales)
        return (out, lse) if return_lse else out
    table = block_table if block_table.dtype is torch.int32 and block_table.is_contiguous() \
        else block_table.to(torch.int32).contiguous()
    qpos = (hi - 1).float()  # unused without ALiBi slopes
    sinks = _EMPTY if sinks is None else sinks.float().contiguous()
    q_in = q.contiguous()
    out, lse = ops.call("decode_paged", q_in, key_pages, value_pages, table, lo, hi, qpos, _EMPTY, sinks,
                        float(scale), float(softcap or 0.0), key_scales, value_scales, return_lse)
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def rows_kept(lengths: torch.Tensor, Lq: int, window: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(lo, hi) (B, Lq) int64, contiguous: row i of sequence b keeps keys lo <= j < hi (causal from the bottom
    right, `window` newest keys)."""
    hi = (lengths.to(torch.int64)[:, None] - Lq + 1 + torch.arange(Lq, device=lengths.device)).clamp(min=0)
    lo = torch.zeros_like(hi) if window is None else (hi - window).clamp(min=0)
    return lo.contiguous(), hi.contiguous()


def plain_paged(q, key_pages, value_pages, block_table, lo, hi, scale: float, sinks=None, softcap=None,
                key_scales=None, value_scales=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same step in torch ops: each sequence's pages gathered (B, Hkv, n * S, .), codes times their scales,
    scores and softmax in float32 -> (out (B, H, Lq, Dv) in q's dtype, lse (B, H, Lq) float32)."""
    B, H, Lq, D = q.shape
    Hkv, S = key_pages.shape[1], key_pages.shape[2]
    G, n = H // Hkv, block_table.shape[1]
    table = block_table.long()
    pages = table.clamp(min=0)

    def gathered(x, scales):  # (P, Hkv, S, .) -> (B, Hkv, n * S, .) float32
        t = x[pages].float()  # (B, n, Hkv, S, .)
        if scales is not None:
            t = t * scales[pages].float()[..., None]
        return t.transpose(1, 2).reshape(B, Hkv, n * S, x.shape[-1])

    k, v = gathered(key_pages, key_scales), gathered(value_pages, value_scales)
    j = torch.arange(n * S, device=q.device)
    present = (table >= 0).repeat_interleave(S, dim=1)  # (B, n * S)
    keep = (j >= lo[..., None]) & (j < hi[..., None]) & present[:, None]  # (B, Lq, N)
    seen = keep.any(dim=1)[:, None, :, None]  # keys some row keeps: the others (NaN there) never reach out
    k, v = torch.where(seen, k, 0.0), torch.where(seen, v, 0.0)
    rows = q.float().reshape(B, Hkv, G * Lq, D)
    scores = (rows @ k.transpose(-1, -2) * scale).view(B, Hkv, G, Lq, n * S)
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    scores = scores.masked_fill(~keep[:, None, None], float("-inf"))
    top = scores.amax(-1, keepdim=True)  # (B, Hkv, G, Lq, 1)
    if sinks is not None:
        top = torch.maximum(top, sinks.float().view(1, Hkv, G, 1, 1))
    top = torch.where(torch.isinf(top), 0.0, top)
    weights = torch.exp(scores - top)
    total = weights.sum(-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sinks.float().view(1, Hkv, G, 1, 1) - top)
    any_key = keep.any(-1)[:, None, None, :, None]  # (B, 1, 1, Lq, 1)
    out = ((weights / total).view(B, Hkv, G * Lq, n * S) @ v).view(B, Hkv, G, Lq, -1)
    out = torch.where(any_key, out, 0.0)
    lse = torch.where(any_key, top + torch.log(total), float("-inf"))
    return out.reshape(B, H, Lq, -1).to(q.dtype), lse.reshape(B, H, Lq)


def _check(q, key_pages, value_pages, block_table, lengths, sinks, key_scales, value_scales, window) -> None:
    """AttentionError unless the inputs fit the module docstring's shapes and dtypes."""
    if q.dim() != 4 or key_pages.dim() != 4 or value_pages.dim() != 4:
        raise AttentionError(f"decode_paged: q (B, H, Lq, D) and pages (P, Hkv, S, D) must be 4-D; got q "
                             f"{tuple(q.shape)}, key_pages {tuple(key_pages.shape)}, value_pages {tuple(value_pages.shape)}")
    B, H, _, D = q.shape
    P, Hkv, S, Dk = key_pages.shape
    if value_pages.shape[:3] != key_pages.shape[:3] or Dk != D or not Hkv or H % Hkv:
        raise AttentionError(f"decode_paged: q {tuple(q.shape)} does not fit key_pages {tuple(key_pages.shape)} "
                             f"and value_pages {tuple(value_pages.shape)} (H a multiple of Hkv, one D, one page shape)")
    if q.dtype not in DTYPES:
        raise AttentionError(f"decode_paged: q must be float32 or bfloat16, got {q.dtype}")
    codes = key_pages.dtype in CODES
    if value_pages.dtype is not key_pages.dtype or key_pages.dtype not in DTYPES + CODES:
        raise AttentionError(f"decode_paged: pages must be float32, bfloat16, int8 or float8_e4m3fn, keys and values "
                             f"alike; got {key_pages.dtype} and {value_pages.dtype}")
    if codes != (key_scales is not None) or codes != (value_scales is not None):
        raise AttentionError("decode_paged: int8 / float8_e4m3fn pages take key_scales and value_scales "
                             f"(P, Hkv, S) float32, float pages none; got {key_pages.dtype} pages with "
                             f"{'no ' if key_scales is None else ''}scales")
    if codes and (key_scales.shape != (P, Hkv, S) or value_scales.shape != (P, Hkv, S)
                  or key_scales.dtype is not torch.float32 or value_scales.dtype is not torch.float32
                  or key_scales.stride() != value_scales.stride() or key_scales.stride(-1) != 1):
        raise AttentionError(f"decode_paged: scales must be ({P}, {Hkv}, {S}) float32 of one layout, contiguous "
                             f"along the slots; got {tuple(key_scales.shape)} and {tuple(value_scales.shape)}")
    if key_pages.stride(-1) != 1 or value_pages.stride(-1) != 1:
        raise AttentionError("decode_paged: pages must be contiguous in their last dim")
    if block_table.dim() != 2 or block_table.shape[0] != B or block_table.dtype not in (torch.int32, torch.int64):
        raise AttentionError(f"decode_paged: block_table must be ({B}, pages per sequence) int32; got "
                             f"{block_table.dtype} {tuple(block_table.shape)}")
    if lengths.shape != (B,) or lengths.dtype not in (torch.int32, torch.int64):
        raise AttentionError(f"decode_paged: lengths must be ({B},) int64; got {lengths.dtype} {tuple(lengths.shape)}")
    if sinks is not None and sinks.shape != (H,):
        raise AttentionError(f"decode_paged: sinks must be ({H},); got {tuple(sinks.shape)}")
    if window is not None and window < 1:
        raise AttentionError(f"decode_paged: window must be a positive number of keys; got {window}")
    if not torch.compiler.is_compiling():  # the kernel reads the table up to each length: check it covers them
        capacity = block_table.shape[1] * S
        if lengths.numel() and (int(lengths.max()) > capacity or int(lengths.min()) < 0):
            raise AttentionError(f"decode_paged: lengths must lie in [0, {capacity}] (pages per sequence x page "
                                 f"size); got {lengths.tolist()}")
        if block_table.numel() and (int(block_table.max()) >= P or int(block_table.min()) < -1):
            raise AttentionError(f"decode_paged: block_table must hold pages in [0, {P}) or -1; got "
                                 f"{int(block_table.min())} to {int(block_table.max())}")
