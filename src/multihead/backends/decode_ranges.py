"""The decode kernel's form of a mask: each query row's kept keys [lo, hi), and ALiBi's positions and slopes.

    key_ranges(mask, B, H, Lq, Lk, device) -> (lo, hi, qpos, slopes) | reason
        lo, hi (B, Lq) int64: query i of sequence b keeps keys lo <= j < hi; qpos (B, Lq) float32: the
        query position ALiBi measures from; slopes (H,) float32 or None.

Every part says its own form (`Part.key_interval`, `Part.distance_bias`), so this file never asks which
kind a part is: a mask kind that keeps one interval of keys per row runs in the decode kernel by
defining its `key_interval`.
"""
from __future__ import annotations

import torch

from multihead.masks import Mask
from multihead.masks.mask import Part

ONLY_INTERVALS = "the decode step takes masks that keep one interval of keys per query row (lengths, causal, " \
    "window, chunks) and ALiBi"
ONE_ALIBI = "the decode step takes one ALiBi part"
MASK_REASONS = (ONLY_INTERVALS, ONE_ALIBI)


def _defines(part: Part, hook: str) -> bool:
    """Whether the part's kind defines `hook` itself (a structural fact: no grid, no tensors)."""
    return getattr(type(part), hook) is not getattr(Part, hook)


def unsupported_mask(mask: Mask | None) -> str | None:
    """Why the decode step cannot take this mask (None: it can); one of MASK_REASONS. Structural: no tensors."""
    if mask is None:
        return None
    if not all(_defines(part, "key_interval") for part in mask.parts):
        return ONLY_INTERVALS
    if sum(_defines(part, "distance_bias") for part in mask.parts) > 1:
        return ONE_ALIBI
    return None


def key_ranges(mask: Mask | None, B: int, H: int, Lq: int, Lk: int, device):
    """(lo, hi, qpos, slopes) for a mask `unsupported_mask` accepts (see the module docstring).
    Reads no values on the host."""
    lo = torch.zeros(B, Lq, dtype=torch.long, device=device)
    hi = torch.full((B, Lq), Lk, dtype=torch.long, device=device)
    qpos, slopes = torch.zeros(B, Lq, device=device), None
    if mask is None:
        return lo, hi, qpos, slopes
    ix = mask.index(B, H, Lq, Lk, device)
    start = lo
    for part in mask.parts:
        lo, hi = part.key_interval(ix, lo, hi)
        bias = part.distance_bias(ix)
        if bias is not None:
            qpos, slopes = bias
    hi = hi if lo is start else torch.maximum(hi, lo)  # an empty range stays empty: hi >= lo
    return lo.contiguous(), hi.contiguous(), qpos.contiguous(), slopes
