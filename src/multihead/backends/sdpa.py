"""The fused backend: torch's scaled_dot_product_attention (flash / fused kernels, CPU and GPU).

The mask keeps its structure on the way in: parts that are exactly SDPA's causal mask become
`is_causal=True`; the rest become one dense bool keep mask (or one additive float mask when there are
offsets). Keys no query may see (padding, lengths) are zeroed in k and v first, so they are inert.

Rows with no key at all must come out exactly zero with zero gradient, not NaN:
- when the mask blocks only whole keys, the row's keys are all zeroed already, so the mask becomes
  additive (0 or the dtype's minimum): such a row spreads evenly over zero values and gives exactly 0;
- otherwise the row is opened for the kernel and its output set to 0 afterwards.
Neither costs a host sync. A NaN in a query row comes out as a NaN row, as in torch's math (see
LOSES_NAN_QUERIES for the kernel that needs help with that). These forms are built once per mask and grid, not once per call.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch._C._nn import scaled_dot_product_attention as _sdpa  # the unpatched kernel entry

from multihead.backends.problem import Problem
from multihead.backends.reasons import Reason, cannot, empty_sequences
from multihead.backends.reference import zero_where
from multihead.backends.scored import reference_on_grid, scored_note, transforms_scores
from multihead.backends.sdpa_kernel import sdpa_kernel_report
from multihead.masks import Index, Mask

# Devices whose fused kernels return a NaN query row as zeros (they read a row whose scores are all NaN
# as a fully masked one): torch 2.13's CPU flash kernel given no mask, and its compiled CPU flex kernel.
LOSES_NAN_QUERIES = ("cpu",)


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
    keep, bias = mask.dense(ix, torch.promote_types(dtype, torch.float32), skip=causal)  # summed in float32
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
    if bias is not None:
        bias = kernel_bias(bias, keep, dtype, ix.rows_may_shift)
    if bias is not None and keep is not None:
        bias = bias.masked_fill(~keep, float("-inf"))
    return SdpaMask(keep if bias is None else bias, False, dead, hidden)


def kernel_bias(bias: torch.Tensor, keep: torch.Tensor | None, dtype: torch.dtype, rows_may_shift: bool) -> torch.Tensor:
    """A float32 bias (.., Lq, Lk) cast once to the kernel's `dtype`. A softmax without sinks ignores a
    constant per row, so where that is allowed each row's largest kept offset is first moved to 0: the
    keys that carry the weight then get the low-precision dtype's finest steps (ALiBi at long lengths)."""
    if dtype == bias.dtype:
        return bias
    if rows_may_shift:
        top = (bias if keep is None else bias.masked_fill(~keep, float("-inf"))).amax(-1, keepdim=True)
        bias = bias - torch.where(torch.isfinite(top), top, torch.zeros((), dtype=top.dtype, device=top.device))
    return bias.clamp_min(torch.finfo(dtype).min).to(dtype)


NO_MASK = SdpaMask(None, False, None, None)


def whole_form(p: Problem) -> SdpaMask:
    """The problem's mask as SDPA takes it on the whole grid, built once per mask and grid (memoized)."""
    mask = p.mask
    if mask is None:
        return NO_MASK
    Lq, Lk, dtype, device = p.q.shape[2], p.k.shape[2], p.q.dtype, p.q.device
    # SDPA's softmax has no sinks, so a per-row constant in the bias may be dropped
    return mask.memoized((Lq, Lk, dtype, device), lambda: sdpa_mask(mask, p.index(rows_may_shift=True), dtype))


def run_sdpa(q, k, v, form: SdpaMask, dropout: float, scale: float, gqa: bool) -> torch.Tensor:
    """SDPA on one grid (the whole batch, one sequence's slice, or one block) with its mask's `form`:
    hidden keys inert, dead rows exactly 0, NaN query rows NaN."""
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
    if attn_mask is None and q.device.type in LOSES_NAN_QUERIES:  # a NaN query row stays NaN, as in torch
        nan_rows = q.sum(-1, keepdim=True)  # (.., Lq, 1): NaN where the row holds NaN (or inf)
        out = out.add_(nan_rows, alpha=0) if not out.requires_grad else torch.add(out, nan_rows, alpha=0)
    return out if form.dead is None else zero_where(form.dead, out)


def run_on_grid(q, k, v, mask: Mask | None, ix: Index, dropout: float, scale: float, gqa: bool) -> torch.Tensor:
    """SDPA on one grid (a sequence's slice, a block of queries) with the mask's form there. A mask with a
    score function (Mask.score_mod) runs the reference math on the same grid instead (backends/scored.py)."""
    if transforms_scores(mask):
        return reference_on_grid(q, k, v, mask, ix, dropout, scale, gqa)
    return run_sdpa(q, k, v, sdpa_mask(mask, ix, q.dtype), dropout, scale, gqa)


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


SOFTCAP = cannot("fused.softcap", "SDPA cannot apply softcap (tanh on the scores) inside the kernel")
SINKS = cannot("fused.sinks", "SDPA has no sink logits in its softmax denominator")
EMPTY = empty_sequences("sdpa.empty", "the fused kernels")


def score_variants_unsupported(p: Problem) -> Reason | None:
    """Why the fused kernels cannot compute this problem's score variants, or None."""
    if p.softcap is not None:
        return SOFTCAP
    if p.sinks is not None:
        return SINKS
    return None


SCORED = "reference math on the whole grid"  # the plan for a mask with a score function (no fused kernel)


class SdpaBackend:
    """Plan: the mask's SdpaMask form on the whole grid (SCORED for a mask with a score function)."""

    name = "sdpa"

    def plan(self, p: Problem, auto: bool = True) -> SdpaMask | str | Reason:
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return EMPTY
        return score_variants_unsupported(p) or (SCORED if transforms_scores(p.mask) else whole_form(p))

    def describe(self, p: Problem, form: SdpaMask | str) -> str:
        if form is SCORED:
            return "in place of F.scaled_dot_product_attention" + scored_note(p, "call")
        kernel = sdpa_kernel_report(p.q, p.k, p.v, form.attn_mask, form.is_causal, p.dropout, p.scale, p.gqa)
        return (f"F.scaled_dot_product_attention, {describe_mask(form)}" + (", enable_gqa=True" if p.gqa else "")
                + f"; torch runs {kernel}")

    def run(self, p: Problem, form: SdpaMask | str) -> torch.Tensor:
        if form is SCORED:
            return reference_on_grid(p.q, p.k, p.v, p.mask, p.index(), p.dropout, p.scale, p.gqa)
        return run_sdpa(p.q, p.k, p.v, form, p.dropout, p.scale, p.gqa)
