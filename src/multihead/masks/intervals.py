"""The one interval formula: which keys a query keeps under causal, window, chunk and length terms.

A query at aligned position p (its index i, or i + valid keys - valid queries bottom-right) keeps
the keys j with lo <= j < hi, where

    right (causal: 0)   hi = p + right + 1
    left  (window W: W - 1)   lo = p - left
    chunk C             lo >= C * (p // C),  hi <= C * (p // C) + C
    key length n        hi <= n

Each bound is None when nothing limits it. The same code runs on host ints (the banded backend's
spans of a block of queries), on tensors of rows (the decode kernel's (B, Lq) intervals) and on
broadcastable index tensors (a dense keep on any grid: `within`).
"""
from __future__ import annotations

import torch


def at_least(x, floor):
    """max(x, floor) for ints or tensors (None: no bound)."""
    return _bounded(x, floor, max, torch.maximum, torch.clamp_min)


def at_most(x, ceiling):
    """min(x, ceiling) for ints or tensors (None: no bound)."""
    return _bounded(x, ceiling, min, torch.minimum, torch.clamp_max)


def _bounded(x, bound, on_ints, on_tensors, clamp):
    """x held to `bound` by `on_ints` (max or min) on two ints, `on_tensors` on two tensors, `clamp` on one."""
    if x is None or bound is None:
        return bound if x is None else x
    if isinstance(x, int) and isinstance(bound, int):
        return on_ints(x, bound)
    if isinstance(bound, int):
        return clamp(x, bound)
    if isinstance(x, int):
        return clamp(bound, x)
    return on_tensors(x, bound)


def bounds(pos, *, left: int | None = None, right: int | None = None, chunk: int | None = None, key_len=None):
    """(lo, hi): the keys lo <= j < hi a query at aligned position `pos` keeps; see the module docstring.

    pos and key_len are ints or tensors that broadcast together; a bound is None where nothing limits it.
    """
    lo = hi = None
    if right is not None:
        hi = pos + (right + 1)
    if left is not None:
        lo = pos - left
    if chunk is not None:
        start = pos // chunk * chunk  # floor division, also for negative positions (ints and tensors)
        lo, hi = at_least(lo, start), at_most(hi, start + chunk)
    if key_len is not None:
        hi = at_most(hi, key_len)
    return lo, hi


def within(k: torch.Tensor, lo, hi) -> torch.Tensor | None:
    """Bool `lo <= k < hi` (key positions k broadcast against the bounds), or None when both are None."""
    keep = None if lo is None else k >= lo
    if hi is not None:
        keep = k < hi if keep is None else keep & (k < hi)
    return keep
