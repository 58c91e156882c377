"""The length-aware backend: each row attends over its valid slices only.

A part that cuts rows into independent slices (`Mask.lengths` with valid_lens (B,): one slice per
row; `Mask.segments`: one per packed segment) gives [(b, q_lo, q_hi, k_lo, k_hi)]. Each slice runs
SDPA on q[b, :, q_lo:q_hi] against k, v[b, :, k_lo:k_hi]; rows no slice covers stay exactly zero. The
work follows the real lengths, sum of (q_hi - q_lo) * (k_hi - k_lo), instead of B * Lq * Lk. Every
other part of the mask (causal, window, ALiBi, dense masks) is evaluated on the slice itself: a
bottom-right causal mask lines up each sequence's last query with its last key, as on the whole grid.

The slices are cut at host-side values, so this backend reads them (free on CPU). It is not used
under torch.compile or tracing, and "auto" leaves it alone on accelerators, where reading them would
stall the device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multihead.backends.problem import Problem
from multihead.backends.scored import scored_note
from multihead.backends.sdpa import run_sdpa, score_variants_unsupported
from multihead.masks import Index

# "auto" picks this backend only when the padding is worth the extra kernel calls:
MIN_PADDING = 0.10  # at least this fraction of the (Lq, Lk) grid is skipped, and
MIN_SAVED_PER_CALL = 1 << 22  # at least this many multiply-adds (score entries x D) saved per extra call


def _slicer(p: Problem):
    """The one part that cuts rows into slices, or None."""
    found = [part for part in p.mask.parts if part.can_slice()] if p.mask is not None else []
    return found[0] if len(found) == 1 else None


def _slices(p: Problem):
    """(slicing part, [(b, q_lo, q_hi, k_lo, k_hi)]) read on the host, or a reason string."""
    part = _slicer(p)
    B, H, Lq, Lk = p.dims
    found = part.slices(Lq, Lk)
    return found if isinstance(found, str) else (part, found)


def _skipped(p: Problem, slices) -> tuple[float, int]:
    """(fraction of the (B, Lq, Lk) grid the slices skip, multiply-adds saved over all heads).

    Multiply-adds, score entries x head dim, weigh a one-token decode step (few scores, many keys
    read) and a prefill (many scores) on one scale.
    """
    B, H, Lq, Lk = p.dims
    dense = B * Lq * Lk
    valid = sum((q_hi - q_lo) * (k_hi - k_lo) for _, q_lo, q_hi, k_lo, k_hi in slices)
    return (1.0 - valid / dense if dense else 0.0), H * p.q.shape[-1] * (dense - valid)


def _connected_zeros(q, k, v, Lq: int) -> torch.Tensor:
    """Exact zeros (H, Lq, Dv) still connected to q, k and v, so backward() always works (with zero
    gradient), even where the inputs hold NaN."""
    def zero(t):
        return t.masked_fill(torch.ones((), dtype=torch.bool, device=t.device), 0.0)

    H, Dv = q.shape[0], v.shape[-1]
    return (zero(q[:, :1, :1]) + zero(k[:1, :1, :1]) + zero(v[:1, :1, :1])).expand(H, Lq, Dv)


class VarlenBackend:
    name = "varlen"

    def unsupported(self, p: Problem) -> str | None:
        if _slicer(p) is None:  # a constant reason: no repr on the hot path
            return ("needs one part that cuts rows into slices: Mask.lengths with valid_lens of shape (B,), "
                    "or Mask.segments")
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return "cuts slices at host-side values, which torch.compile and tracing cannot follow"
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return f"the fused kernels need non-empty sequences; got Lq={Lq}, Lk={Lk}"
        variants = score_variants_unsupported(p)
        if variants is not None:
            return variants
        if p.q.device.type == "cpu":  # reading the slices is free here; elsewhere run() finds out
            found = _slices(p)
            return found if isinstance(found, str) else None
        return None

    def declines(self, p: Problem) -> str | None:
        if p.q.device.type != "cpu":
            return "reading the lengths on the host would stall the device; the dense path stays on it"
        _, slices = _slices(p)
        fraction, saved = _skipped(p, slices)
        if fraction < MIN_PADDING:
            return (f"only {fraction:.0%} of the (Lq, Lk) grid is padding (needs {MIN_PADDING:.0%}); "
                    f"one dense call beats {len(slices)} per-slice calls")
        if saved < MIN_SAVED_PER_CALL * len(slices):
            return (f"skipping the padding saves {saved} multiply-adds, under {MIN_SAVED_PER_CALL} per "
                    f"slice; {len(slices)} separate kernel calls would cost more than they save")
        return None

    def describe(self, p: Problem) -> str:
        _, slices = _slices(p)
        fraction, _ = _skipped(p, slices)
        return (f"F.scaled_dot_product_attention per slice on its valid part ({len(slices)} calls, "
                f"{fraction:.0%} of the (Lq, Lk) grid skipped as padding)"
                + (", enable_gqa=True" if p.gqa else "") + scored_note(p, "slice"))

    def run(self, p: Problem) -> torch.Tensor:
        found = _slices(p)
        if isinstance(found, str):
            from multihead.errors import AttentionError

            raise AttentionError(f"backend 'varlen' cannot run this call: {found}.")
        part, slices = found
        B, H, Lq, Lk = p.dims
        ix = p.index()
        q_ext = ix.q_extent if isinstance(ix.q_extent, int) else ix.q_extent.view(-1).tolist()
        k_ext = ix.k_extent if isinstance(ix.k_extent, int) else ix.k_extent.view(-1).tolist()
        # unbind / cat / stack rather than writing slices into one zero tensor: their backward
        # allocates each gradient once, where slice writes would allocate one full-size gradient each.
        qs, ks, vs = p.q.unbind(0), p.k.unbind(0), p.v.unbind(0)  # B x (H or Hkv, L, D)
        rows = []
        for b in range(B):
            pieces, at = [], 0
            for _, q_lo, q_hi, k_lo, k_hi in sorted(s for s in slices if s[0] == b and s[2] > s[1] and s[4] > s[3]):
                if q_lo > at:
                    pieces.append(qs[b].new_zeros(H, q_lo - at, p.v.shape[-1]))  # rows no slice covers
                ext = (q_ext if isinstance(q_ext, int) else q_ext[b], k_ext if isinstance(k_ext, int) else k_ext[b])
                grid = Index.slice(b, q_lo, q_hi, k_lo, k_hi, *ext, (part,), p.q.device, H=H)
                out = run_sdpa(qs[b][None, :, q_lo:q_hi], ks[b][None, :, k_lo:k_hi], vs[b][None, :, k_lo:k_hi],
                               p.mask, grid, p.dropout, p.scale, p.gqa)  # (1, H, q_hi - q_lo, Dv)
                pieces.append(out[0])
                at = q_hi
            if not pieces:  # no query of this row sees a key: the row's output is 0
                rows.append(_connected_zeros(qs[b], ks[b], vs[b], Lq))
                continue
            row = torch.cat(pieces, dim=1) if len(pieces) > 1 else pieces[0]
            rows.append(F.pad(row, (0, 0, 0, Lq - at)))  # (H, Lq, Dv), uncovered query rows are 0
        return torch.stack(rows)  # (B, H, Lq, Dv)
