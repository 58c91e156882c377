"""SDPA's arguments for one grid, derived from the normal form, and SDPA run on that grid.

Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv). The grid is the whole call, one sequence's
slice (varlen) or one block of queries (banded); the three SDPA-based backends share this one form.

The mask keeps its structure on the way in: a folded top-left causal term on a plain grid becomes
`is_causal=True`; the rest becomes one dense bool keep mask (or one additive float mask when there are
offsets). Keys no query may see (padding, lengths) are zeroed in k and v first, so they are inert.
Rows with no key at all come out exactly zero with zero gradient, not NaN:
- when the mask blocks only whole keys and the host may read it (the CPU, eager) and every sequence
  keeps the same keys, only those keys are passed (a view when they are a prefix) and no mask at all;
- else when the mask blocks only whole keys, the hidden keys are zeroed and the mask becomes additive
  (0 or the dtype's minimum): a row with no key spreads evenly over zero values and gives exactly 0;
- otherwise the row is opened for the kernel and its output set to 0 afterwards (on the CPU, eager, only
  when some row keeps no key: the plan reads that once).
A NaN in a query row comes out as a NaN row, as in torch's math (common.keep_nan_rows).
A mask with a score function (Mask.score_mod) runs the reference math on the same grid instead, since
no fused SDPA kernel takes a function of the scores.
Sinks (H,): torch's CPU flash kernel, the op under SDPA, runs the grid and returns its log-sum-exp, and the
output is rescaled per row (sink_rescale.py). Per-row constants of the mask count against the sink: each
row's largest offset is still moved to 0 for the kernel (small scores keep their precision), and the
sinks' comparison adds it back (SdpaArgs.shift).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from multihead.backends.graphs import building_graph
from multihead.backends.common import keep_nan_rows, reference_on_grid, sink_alone, zero_where
from multihead.backends.problem import Problem
from multihead.backends.sink_rescale import flash_with_lse, flash_with_sinks
from multihead.masks import Index, NormalForm
from multihead.masks.values import values_checkable

# appended to a backend's description when the scored path runs (mh.dispatch says what ran)
SCORED_NOTE = ("; the mask's score_mod changes the scores, which no fused SDPA kernel takes, so each {grid} "
               "runs the reference math (matmul + float32 softmax + matmul) instead of the kernel")

SINKS_NOTE = ("; sinks from each {grid}'s log-sum-exp (torch's CPU flash kernel, the op under "
              "F.scaled_dot_product_attention: out * sigmoid(lse - sink))")
SCORED_SINKS_NOTE = ", sinks in its softmax"


class SdpaArgs(NamedTuple):
    attn_mask: torch.Tensor | None  # bool keep, or float with -inf / dtype min at blocked entries
    is_causal: bool
    dead: torch.Tensor | None  # (.., Lq, 1) rows to zero after the kernel
    hidden: torch.Tensor | None  # (B, 1, Lk, 1) keys to zero in k and v before it
    keys: int | torch.Tensor | None = None  # only the first `keys` keys, or these, are passed (every query blocks
    # the others)
    shift: torch.Tensor | None = None  # (.., Lq, 1) float32: each row's constant taken out of the bias (sinks add
    # it back: the sink competes with the unshifted scores)


NO_MASK = SdpaArgs(None, False, None, None)


def sdpa_args(form: NormalForm, ix: Index, dtype: torch.dtype, sinks: bool = False) -> SdpaArgs:
    """How SDPA takes the mask's `form` on grid `ix` (see the module docstring). sinks: the call has sinks, so
    `ix` keeps per-row constants; each row's largest offset is still moved to 0 for the kernel, and the
    amount is returned as `shift` for the sinks to add back."""
    if len(form.parts) == 0:
        return NO_MASK
    causal = form.causal_on(ix)
    # offsets are summed in float32, or on a slice or block (a small grid) in float64, so that `kernel_bias`
    # moves each row's largest to 0 before the one rounding to the kernel's dtype (ALiBi far from key 0)
    work = (torch.float64 if not ix.whole and (ix.rows_may_shift or sinks)
            else torch.promote_types(dtype, torch.float32))
    keep, bias = form.dense(ix, work, skip=causal)
    if keep is None and bias is None:
        return SdpaArgs(None, len(causal) > 0, None, None)
    visible = form.key_visible(ix)
    hidden = None if visible is None else ~visible.transpose(-1, -2)  # (B, 1, Lk, 1)
    if len(causal) == 0 and bias is None and form.blocks_only_keys:
        kept = _kept_keys(keep, ix)
        if kept is not None:
            return SdpaArgs(None, False, None, None, kept)
        if hidden is not None:
            zero = torch.zeros((), dtype=dtype, device=keep.device)
            return SdpaArgs(torch.where(keep, zero, torch.finfo(dtype).min), False, None, hidden)
    for part in causal:  # other parts need a dense mask: the causal one joins it
        keep = part.keep(ix) if keep is None else keep & part.keep(ix)
    dead = None
    if keep is not None:
        dead = ~keep.any(dim=-1, keepdim=True)  # (.., Lq, 1): rows that keep no key
        if values_checkable(dead) and not bool(dead.any()):  # read once per plan where it is free
            dead = None
        else:
            keep = keep | dead  # open them for the kernel; zeroed after
    shift = None
    if bias is not None and sinks:
        shift = row_tops(bias, keep)
        bias, shift = bias - shift, shift.to(torch.float32)
    if bias is not None:
        bias = kernel_bias(bias, keep, dtype, ix.rows_may_shift)
    if bias is not None and keep is not None:
        bias = bias.masked_fill(~keep, float("-inf"))
    return SdpaArgs(keep if bias is None else bias, False, dead, hidden, None, shift)


def _kept_keys(keep: torch.Tensor, ix: Index) -> int | torch.Tensor | None:
    """The keys a key-only keep (B or 1, 1, 1, Lk) keeps, when every sequence keeps the same ones and reading
    them is free (the whole grid on the CPU, eager): their count when they are a prefix, else their indices.
    None when that does not hold, or no key is kept (the general form makes those rows exact zeros)."""
    if (not ix.whole or keep.device.type != "cpu" or building_graph()
            or keep.dim() != 4 or keep.shape[0] != 1 and ix.B != 1):
        return None
    kept = keep.reshape(-1)  # (Lk,)
    n = int(kept.sum())
    if n == 0:
        return None
    if bool(kept[:n].all()):
        return n
    return kept.nonzero().view(-1)


def kept_keys(t: torch.Tensor, keys: int | torch.Tensor) -> torch.Tensor:
    """t (B, Hkv, Lk, X) at the kept keys: the first `keys` (a view), or those indexed."""
    return t.narrow(2, 0, keys) if isinstance(keys, int) else t.index_select(2, keys)


def kernel_bias(bias: torch.Tensor, keep: torch.Tensor | None, dtype: torch.dtype, rows_may_shift: bool) -> torch.Tensor:
    """A float32 or float64 bias (.., Lq, Lk) cast once to the kernel's `dtype`. A softmax without sinks
    ignores a constant per row, so where that is allowed each row's largest kept offset is first moved to 0:
    the keys that carry the weight then get the kernel dtype's finest steps (ALiBi at long lengths)."""
    if dtype == bias.dtype:
        return bias
    if rows_may_shift:
        bias = bias - row_tops(bias, keep)
    return bias.clamp_min(torch.finfo(dtype).min).to(dtype)


def row_tops(bias: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Each row's largest kept offset of `bias` (.., Lq, Lk), 0 for a row that keeps none: (.., Lq, 1)."""
    top = (bias if keep is None else bias.masked_fill(~keep, float("-inf"))).amax(-1, keepdim=True)
    return torch.where(torch.isfinite(top), top, torch.zeros((), dtype=top.dtype, device=top.device))


def run_sdpa(q, k, v, args: SdpaArgs, dropout: float, scale: float, gqa: bool, sinks=None) -> torch.Tensor:
    """SDPA on one grid with its `args`: hidden keys inert, dead rows exactly 0, NaN query rows NaN.
    sinks (H,): the CPU flash kernel with its log-sum-exp carries them (sink_rescale.py)."""
    if (args.attn_mask is None and args.keys is None and args.hidden is None and args.dead is None and not gqa
            and sinks is None):
        out = F.scaled_dot_product_attention(q, k, v, None, dropout, args.is_causal, scale=scale)  # the common call
        return keep_nan_rows(out, q) if q.is_cpu else out  # a NaN query row stays NaN, as in torch
    if args.keys is not None:
        k, v = kept_keys(k, args.keys), kept_keys(v, args.keys)
    if args.hidden is not None:
        k, v = zero_where(args.hidden, k), zero_where(args.hidden, v)
    attn_mask = args.attn_mask
    if attn_mask is not None and torch.compiler.is_exporting():
        # onnxruntime's Attention kernel needs the mask's query dim spelled out: expand it (a view).
        attn_mask = attn_mask.expand(*attn_mask.shape[:-2], q.shape[-2], attn_mask.shape[-1])
    if sinks is not None:
        out = flash_with_sinks(q, k, v, sinks, attn_mask, args.is_causal, scale, args.shift)
    elif gqa and q.shape[2] == 1 and not args.is_causal and not torch.compiler.is_exporting():
        out = _grouped_decode(q, k, v, attn_mask, dropout, scale)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask, dropout, args.is_causal, scale=scale, enable_gqa=gqa)
    if attn_mask is None and q.is_cpu:  # a NaN query row stays NaN, as in torch
        out = keep_nan_rows(out, q)
    return out if args.dead is None else zero_where(args.dead, out)


def run_sdpa_with_lse(q, k, v, args: SdpaArgs, scale: float, sinks=None) -> tuple[torch.Tensor, torch.Tensor]:
    """run_sdpa's output and its log-sum-exp (B, H, Lq) float32 (a row that keeps no key: -inf, or its sink), from
    torch's CPU flash kernel; no dropout, no gradient. `args` made with sinks=True (each row's shift recorded)."""
    if args.keys is not None:
        k, v = kept_keys(k, args.keys), kept_keys(v, args.keys)
    if args.hidden is not None:
        k, v = zero_where(args.hidden, k), zero_where(args.hidden, v)
    out, lse = flash_with_lse(q, k, v, sinks, args.attn_mask, args.is_causal, scale, args.shift)
    if args.attn_mask is None:  # a NaN query row stays NaN, as in torch
        out = keep_nan_rows(out, q)
    # a row that keeps no key: dead, or every key at the dtype's minimum (a mask that blocks whole keys)
    empty = lse <= torch.finfo(q.dtype).min / 2
    if args.dead is not None:
        out, empty = zero_where(args.dead, out), empty | args.dead.squeeze(-1)
    return out, sink_alone(lse.masked_fill(empty, float("-inf")), sinks)  # its sink alone, or nothing


def run_on_grid(q, k, v, form: NormalForm, ix: Index, dropout: float, scale: float, gqa: bool,
                sinks=None) -> torch.Tensor:
    """SDPA on one grid (a sequence's slice, a block of queries) with the form's arguments there; a mask with
    a score function runs the reference math on the same grid instead. sinks (H,) or None; with sinks `ix`
    must keep per-row constants (rows_may_shift=False)."""
    if form.scored:
        return reference_on_grid(q, k, v, form, ix, dropout, scale, sinks=sinks)
    return run_sdpa(q, k, v, sdpa_args(form, ix, q.dtype, sinks is not None), dropout, scale, gqa, sinks)


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
    out = F.scaled_dot_product_attention(q.reshape(B, Hkv, H // Hkv, D), k, v, attn_mask, dropout, False,
                                         scale=scale)  # (B, Hkv, G, Dv)
    return out.reshape(B, H, 1, v.shape[-1])


def describe_args(args: SdpaArgs) -> str:
    """How the mask reaches SDPA, in words."""
    if args.is_causal:
        return "is_causal=True (the causal structure is kept, no dense mask)"
    if args.keys is not None:
        kept = args.keys if isinstance(args.keys, int) else args.keys.numel()
        how = "the first" if isinstance(args.keys, int) else "the"
        return f"no mask: only {how} {kept} keys every query may see are passed (the mask blocks whole keys)"
    if args.attn_mask is None:
        return "no mask"
    kind = "bool keep" if args.attn_mask.dtype == torch.bool else "additive float"
    inert = "; keys no query may see are zeroed in k and v (inert)" if args.hidden is not None else ""
    return f"dense {kind} mask of shape {tuple(args.attn_mask.shape)}{inert}"


def scored_note(p: Problem, grid: str) -> str:
    """SCORED_NOTE for a problem whose mask transforms scores, else ""; grid names what runs separately.
    With sinks, also how they are carried."""
    note = SCORED_NOTE.format(grid=grid) if p.form.scored else ""
    if p.sinks is not None:
        note += SCORED_SINKS_NOTE if p.form.scored else SINKS_NOTE.format(grid=grid)
    return note
