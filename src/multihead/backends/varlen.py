"""The length-aware backend: each row attends over its valid slices only.

The normal form's lengths (valid_lens (B,): one slice per row) or segments (one slice per packed
segment) cut rows into independent slices [(b, q_lo, q_hi, k_lo, k_hi)] (`slices`). Each slice runs
SDPA on q[b, :, q_lo:q_hi] against k, v[b, :, k_lo:k_hi]; rows no slice covers stay exactly zero. The
work follows the real lengths, sum of (q_hi - q_lo) * (k_hi - k_lo), instead of B * Lq * Lk. Every
other part of the mask (causal, window, ALiBi, dense masks) is evaluated on the slice itself: a
bottom-right causal mask lines up each sequence's last query with its last key, as on the whole grid.

The slices are cut at host-side values, so this backend reads them, once per call, in its plan (free
on CPU). It is not used
under torch.compile or tracing, and "auto" leaves it alone on accelerators, where reading them would
stall the device.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from multihead.backends.capabilities import Capabilities
from multihead.backends.common import connected_zeros, score_variants_unsupported
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot, declines
from multihead.backends.sdpa_args import run_on_grid, scored_note
from multihead.masks import Index, NormalForm

# "auto" picks this backend only when the padding is worth the extra kernel calls, per device type:
# at least MIN_PADDING of the (Lq, Lk) grid is skipped, and at least MIN_SAVED_PER_CALL multiply-adds
# (score entries x D) are saved per extra call. Only the CPU reads lengths for free.
MIN_PADDING = 0.10
MIN_SAVED_PER_CALL = 1 << 22
FREE_HOST_READS = ("cpu",)


class VarlenPlan(NamedTuple):
    parts: tuple  # the parts that cut rows into slices (each slice keeps every entry they keep)
    slices: list  # [(b, q_lo, q_hi, k_lo, k_hi)], read on the host once


def slices(form: NormalForm, Lq: int) -> list | str:
    """[(b, q_lo, q_hi, k_lo, k_hi)]: the only entries the form's lengths (B,) or segments keep, read on
    the host; or why they cannot be cut."""
    if form.segments is None:
        klens = form.key_lens.tolist()
        qlens = form.query_lens.tolist() if form.query_lens is not None else [Lq] * len(klens)
        return [(b, 0, q, 0, k) for b, (q, k) in enumerate(zip(qlens, klens))]
    out = []
    q_ids, k_ids = form.segments
    for b, (q_row, k_row) in enumerate(zip(q_ids.tolist(), k_ids.tolist())):
        q_runs, k_runs = _runs(q_row), _runs(k_row)
        if q_runs is None or k_runs is None:
            return "a segment id appears in more than one run of a row; the dense path takes those"
        out += [(b, q_lo, q_hi) + k_runs[i] for i, (q_lo, q_hi) in q_runs.items() if i in k_runs]
    return out


def _runs(ids: list[int]) -> dict[int, tuple[int, int]] | None:
    """{id: (start, end)} of each run of equal ids; None when an id comes back after another."""
    runs: dict[int, tuple[int, int]] = {}
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            if ids[start] in runs:
                return None
            runs[ids[start]] = (start, i)
            start = i
    return runs


def _skipped(p: Problem, slices) -> tuple[float, int]:
    """(fraction of the (B, Lq, Lk) grid the slices skip, multiply-adds saved over all heads).

    Multiply-adds, score entries x head dim, weigh a one-token decode step (few scores, many keys
    read) and a prefill (many scores) on one scale.
    """
    B, H, Lq, Lk = p.dims
    dense = B * Lq * Lk
    valid = sum((q_hi - q_lo) * (k_hi - k_lo) for _, q_lo, q_hi, k_lo, k_hi in slices)
    return (1.0 - valid / dense if dense else 0.0), H * p.q.shape[-1] * (dense - valid)


def _slices_of(p: Problem) -> list:
    """The slices again, for mh.dispatch's words only (never on the hot path)."""
    return slices(p.form, p.dims[2])


NO_SLICER = cannot("varlen.no-slicer", "needs one part that cuts rows into slices: Mask.lengths with valid_lens "
                                       "of shape (B,), or Mask.segments")
DEVICE_STALL = declines("varlen.device-stall", "reading the lengths on the host would stall the device; the dense "
                                               "path stays on it")
LITTLE_PADDING = declines("varlen.little-padding", lambda p: (
    f"only {_skipped(p, _slices_of(p))[0]:.0%} of the (Lq, Lk) grid is padding (needs {MIN_PADDING:.0%}); "
    f"one dense call beats {len(_slices_of(p))} per-slice calls"))
TOO_LITTLE_SAVED = declines("varlen.too-little-saved", lambda p: (
    f"skipping the padding saves {_skipped(p, _slices_of(p))[1]} multiply-adds, under {MIN_SAVED_PER_CALL} per "
    f"slice; {len(_slices_of(p))} separate kernel calls would cost more than they save"))


def _unsliceable(words: str):
    """The slicing part's own reason (a constant string) as a refusal."""
    return cannot("varlen.unsliceable", words)


class VarlenBackend:
    """Plan: VarlenPlan (the slicing parts and their slices, read on the host once per planned call)."""

    name = "varlen"
    capabilities = Capabilities(empty=False, recorded=False, compiled=False)  # it cuts slices at host values

    def plan(self, p: Problem, auto: bool = True):
        parts = p.form.slicer()
        if parts is None:
            return NO_SLICER
        B, H, Lq, Lk = p.dims
        variants = score_variants_unsupported(p)
        if variants is not None:
            return variants
        if auto and p.q.device.type not in FREE_HOST_READS:
            return DEVICE_STALL
        cut = slices(p.form, Lq)  # the one host read of this call
        if isinstance(cut, str):
            return _unsliceable(cut)
        if auto:
            fraction, saved = _skipped(p, cut)
            if fraction < MIN_PADDING:
                return LITTLE_PADDING
            if saved < MIN_SAVED_PER_CALL * len(cut):
                return TOO_LITTLE_SAVED
        return VarlenPlan(parts, cut)

    def describe(self, p: Problem, plan: VarlenPlan) -> str:
        fraction, _ = _skipped(p, plan.slices)
        return (f"F.scaled_dot_product_attention per slice on its valid part ({len(plan.slices)} calls, "
                f"{fraction:.0%} of the (Lq, Lk) grid skipped as padding)"
                + (", enable_gqa=True" if p.gqa else "") + scored_note(p, "slice"))

    def run(self, p: Problem, plan: VarlenPlan) -> torch.Tensor:
        B, H, Lq, Lk = p.dims
        # Each sequence's extents are its slice's ends: only Mask.lengths (B,) gives extents, and then
        # it is the part that cut the slices (b, 0, query_len, 0, key_len). No second host read.
        own_extents = p.form.extents is not None
        # unbind / cat / stack rather than writing slices into one zero tensor: their backward
        # allocates each gradient once, where slice writes would allocate one full-size gradient each.
        qs, ks, vs = p.q.unbind(0), p.k.unbind(0), p.v.unbind(0)  # B x (H or Hkv, L, D)
        by_row = [[] for _ in range(B)]
        for s in sorted(plan.slices):
            if s[2] > s[1] and s[4] > s[3]:
                by_row[s[0]].append(s)
        rows = []
        for b in range(B):
            pieces, at = [], 0
            for _, q_lo, q_hi, k_lo, k_hi in by_row[b]:
                if q_lo > at:
                    pieces.append(qs[b].new_zeros(H, q_lo - at, p.v.shape[-1]))  # rows no slice covers
                ext = (q_hi, k_hi) if own_extents else (Lq, Lk)
                grid = Index.slice(b, q_lo, q_hi, k_lo, k_hi, *ext, plan.parts, p.q.device, H=H,
                                   rows_may_shift=p.sinks is None)  # without sinks low precision shifts rows
                out = run_on_grid(qs[b][None, :, q_lo:q_hi], ks[b][None, :, k_lo:k_hi], vs[b][None, :, k_lo:k_hi],
                                  p.form, grid, p.dropout, p.scale, p.gqa, p.sinks)  # (1, H, q_hi - q_lo, Dv)
                pieces.append(out[0])
                at = q_hi
            if not pieces:  # no query of this row sees a key: the row's output is 0
                rows.append(connected_zeros((H, Lq, p.v.shape[-1]), p.v.dtype, qs[b], ks[b], vs[b]))
                continue
            row = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
            rows.append(F.pad(row, (0, 0, 0, Lq - at)))  # (H, Lq, Dv), uncovered query rows are 0
        return torch.stack(rows)  # (B, H, Lq, Dv)
