"""The fused backend: torch's scaled_dot_product_attention (flash / fused kernels, CPU and GPU).

The mask keeps its structure on the way in: parts that are exactly SDPA's causal mask become
`is_causal=True`; the rest become one dense bool keep mask (or one additive float mask when there are
offsets). Keys no query may see (padding, lengths) are zeroed in k and v first, so they are inert.

Rows with no key at all must come out exactly zero with zero gradient, not NaN:
- when the mask blocks only whole keys, the row's keys are all zeroed already, so the mask becomes
  additive (0 or the dtype's minimum): such a row spreads evenly over zero values and gives exactly 0;
- otherwise the row is opened for the kernel and its output set to 0 afterwards.
Neither costs a host sync. These forms are built once per mask and grid, not once per call.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch._C._nn import scaled_dot_product_attention as _sdpa  # the unpatched kernel entry

from multihead.backends.problem import Problem
from multihead.backends.reference import zero_where
from multihead.backends.scored import reference_on_grid, scored_note, transforms_scores
from multihead.backends.sdpa_kernel import sdpa_kernel_report
from multihead.masks import Index, Mask


class SdpaMask(NamedTuple):
    attn_mask: torch.Tensor | None  # bool keep, or float with -inf / dtype min at blocked entries
    is_causal: bool
    dead: torch.Tensor | None  # (.., Lq, 1) rows to zero after the kernel
    hidden: torch.Tensor | None  # (B, 1, Lk, 1) keys to zero in k and v before it


def sdpa_mask(mask: Mask | None, ix: Index, dtype: torch.dtype) -> SdpaMask:
    """How SDPA takes `mask` on grid `ix` (see the module docstring)."""
    if mask is None:
        return SdpaMask(None, False, None, None)
    causal = mask.causal_parts(ix)
    keep, bias = mask.dense(ix, dtype, skip=causal)
    if keep is None and bias is None:
        return SdpaMask(None, bool(causal), None, None)
    visible = mask.key_keep(ix)
    hidden = None if visible is None else ~visible.transpose(-1, -2)  # (B, 1, Lk, 1)
    if not causal and hidden is not None and mask.only_key_blocks(ix):
        zero = torch.zeros((), dtype=dtype, device=keep.device)
        return SdpaMask(torch.where(keep, zero, torch.finfo(dtype).min), False, None, hidden)
    for part in causal:  # other parts need a dense mask: the causal one joins it
        keep = part.keep(ix) if keep is None else keep & part.keep(ix)
    dead = None
    if keep is not None:
        dead = ~keep.any(dim=-1, keepdim=True)  # (.., Lq, 1): rows that keep no key
        keep = keep | dead  # open them for the kernel; zeroed after
    if bias is not None and keep is not None:
        bias = bias.masked_fill(~keep, float("-inf"))
    return SdpaMask(keep if bias is None else bias, False, dead, hidden)


def run_sdpa(q, k, v, mask: Mask | None, ix, dropout: float, scale: float, gqa: bool) -> torch.Tensor:
    """SDPA on one grid (the whole batch, or one sequence's slice): inert hidden keys, dead rows exactly 0.

    ix: the grid's Index, or a function that makes it (the whole grid: its form is remembered per mask,
    so a call that finds it needs no Index at all).
    """
    if transforms_scores(mask):  # a score_mod: no fused kernel takes it (see backends/scored.py)
        return reference_on_grid(q, k, v, mask, ix() if callable(ix) else ix, dropout, scale, gqa)
    if mask is None:
        form = SdpaMask(None, False, None, None)
    elif callable(ix):
        key = (q.shape[2], k.shape[2], q.dtype, q.device)
        form = mask.memoized(key, lambda: sdpa_mask(mask, ix(), q.dtype))
    else:
        form = sdpa_mask(mask, ix, q.dtype)
    if form.hidden is not None:
        k, v = zero_where(form.hidden, k), zero_where(form.hidden, v)
    attn_mask = form.attn_mask
    if attn_mask is not None and torch.compiler.is_exporting():
        # onnxruntime's Attention kernel needs the mask's query dim spelled out: expand it (a view).
        attn_mask = attn_mask.expand(*attn_mask.shape[:-2], q.shape[-2], attn_mask.shape[-1])
    if gqa and q.shape[2] == 1 and not form.is_causal and not torch.compiler.is_exporting():
        out = _grouped_decode(q, k, v, attn_mask, dropout, scale)
    else:
        out = _sdpa(q, k, v, attn_mask, dropout, form.is_causal, scale=scale, enable_gqa=gqa)
    return out if form.dead is None else zero_where(form.dead, out)


def _grouped_decode(q, k, v, attn_mask, dropout: float, scale: float) -> torch.Tensor:
    """One query per sequence with GQA: the G query heads of each kv group become G query rows.

    q (B, H, 1, D) -> (B, Hkv, G, D): each kv head is read once for its whole group, where SDPA's
    enable_gqa reads it once per query head. Exact, since the one query row per head is independent.
    """
    B, H, _, D = q.shape
    Hkv = k.shape[1]
    if attn_mask is not None:
        m = attn_mask.view((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))  # (B or 1, H or 1, 1, Lk)
        attn_mask = m.reshape(m.shape[0], Hkv, H // Hkv, m.shape[-1]) if m.shape[1] == H else m  # (.., Hkv, G, Lk)
    out = _sdpa(q.reshape(B, Hkv, H // Hkv, D), k, v, attn_mask, dropout, False, scale=scale)  # (B, Hkv, G, Dv)
    return out.reshape(B, H, 1, v.shape[-1])


def describe_mask(form: SdpaMask) -> str:
    """How the mask reaches SDPA, in words."""
    if form.is_causal:
        return "is_causal=True (the causal structure is kept, no dense mask)"
    if form.attn_mask is None:
        return "no mask"
    kind = "bool keep" if form.attn_mask.dtype == torch.bool else "additive float"
    inert = "; keys no query may see are zeroed in k and v (inert)" if form.hidden is not None else ""
    return f"dense {kind} mask of shape {tuple(form.attn_mask.shape)}{inert}"


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
        if transforms_scores(p.mask):
            return "in place of F.scaled_dot_product_attention" + scored_note(p, "call")
        form = sdpa_mask(p.mask, p.index(rows_may_shift=True), p.q.dtype)
        kernel = sdpa_kernel_report(p.q, p.k, p.v, form.attn_mask, form.is_causal, p.dropout, p.scale, p.gqa)
        return (f"F.scaled_dot_product_attention, {describe_mask(form)}" + (", enable_gqa=True" if p.gqa else "")
                + f"; torch runs {kernel}")

    def run(self, p: Problem) -> torch.Tensor:
        # SDPA's softmax has no sinks, so a per-row constant in the bias may be dropped
        return run_sdpa(p.q, p.k, p.v, p.mask, lambda: p.index(rows_may_shift=True), p.dropout, p.scale, p.gqa)
