"""The fused backend: torch's scaled_dot_product_attention (flash / fused kernels, CPU and GPU).

The mask keeps its structure on the way in: parts that are exactly SDPA's causal mask become
`is_causal=True`; the rest become one dense bool keep mask (or one additive float mask when there are
offsets). Rows with no key at all are opened to every key for the kernel and their output set to 0
afterwards, so they come out exactly zero with zero gradient instead of NaN. That costs one small
reduction over the mask, never a host sync.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch._C._nn import scaled_dot_product_attention as _sdpa  # the unpatched kernel entry

from multihead.backends.problem import Problem
from multihead.backends.reference import inert_keys
from multihead.masks import Index, Mask


def sdpa_mask(mask: Mask | None, ix: Index, dtype: torch.dtype):
    """(attn_mask, is_causal, dead) for SDPA on grid `ix`.

    attn_mask: None, bool keep, or float with -inf at blocked entries, broadcastable to the grid.
    dead: (.., Lq, 1) rows that keep no key (their output must be zeroed), or None.
    """
    if mask is None:
        return None, False, None
    causal = mask.causal_parts(ix)
    keep, bias = mask.dense(ix, dtype, skip=causal)
    if keep is None and bias is None:
        return None, bool(causal), None
    for part in causal:  # other parts need a dense mask: the causal one joins it
        keep = part.keep(ix) if keep is None else keep & part.keep(ix)
    dead = None
    if keep is not None:
        dead = ~keep.any(dim=-1, keepdim=True)  # (.., Lq, 1): rows that keep no key
        keep = keep | dead  # open them for the kernel; zeroed after
    if bias is None:
        return keep, False, dead
    return (bias if keep is None else bias.masked_fill(~keep, float("-inf"))), False, dead


def run_sdpa(q, k, v, mask: Mask | None, ix: Index, dropout: float, scale: float, gqa: bool) -> torch.Tensor:
    """SDPA on one grid (the whole batch, or one sequence's slice), dead rows exactly 0."""
    attn_mask, is_causal, dead = sdpa_mask(mask, ix, q.dtype)
    if attn_mask is not None and torch.compiler.is_exporting():
        # onnxruntime's Attention kernel needs the mask's query dim spelled out: expand it (a view).
        attn_mask = attn_mask.expand(*attn_mask.shape[:-2], q.shape[-2], attn_mask.shape[-1])
    out = _sdpa(q, k, v, attn_mask, dropout, is_causal, scale=scale, enable_gqa=gqa)
    return out if dead is None else out.masked_fill(dead, 0.0)


def describe_mask(mask: Mask | None, ix: Index, dtype: torch.dtype) -> str:
    attn_mask, is_causal, _ = sdpa_mask(mask, ix, dtype)
    if is_causal:
        return "is_causal=True (the causal structure is kept, no dense mask)"
    if attn_mask is None:
        return "no mask"
    kind = "bool keep" if attn_mask.dtype == torch.bool else "additive float"
    return f"dense {kind} mask of shape {tuple(attn_mask.shape)}"


def score_variants_unsupported(p: Problem) -> str | None:
    """Why the fused kernels cannot compute this problem's score variants, or None."""
    if p.softcap is not None:
        return "SDPA cannot apply softcap (tanh on the scores) inside the kernel"
    if p.sinks is not None:
        return "SDPA has no sink logits in its softmax denominator"
    return None


class SdpaBackend:
    name = "sdpa"

    def unsupported(self, p: Problem) -> str | None:
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return f"the fused kernels need non-empty sequences; got Lq={Lq}, Lk={Lk}"
        return score_variants_unsupported(p)

    def declines(self, p: Problem) -> str | None:
        return None

    def describe(self, p: Problem) -> str:
        form = describe_mask(p.mask, _shifting(p.index()), p.q.dtype)
        return f"F.scaled_dot_product_attention, {form}" + (", enable_gqa=True" if p.gqa else "")

    def run(self, p: Problem) -> torch.Tensor:
        ix = _shifting(p.index())
        k, v = inert_keys(p, ix)
        return run_sdpa(p.q, k, v, p.mask, ix, p.dropout, p.scale, p.gqa)


def _shifting(ix: Index) -> Index:
    """SDPA's softmax has no sinks, so a per-row constant in the bias may be dropped."""
    return replace(ix, rows_may_shift=True)
