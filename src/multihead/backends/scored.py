"""Masks with a score function (Mask.score_mod) on the SDPA-based backends: the reference math per grid.

No fused SDPA kernel takes a function of the scores, so where sdpa, varlen or banded would hand one
grid to the kernel (the whole grid, one sequence's valid slice, one block of queries), a mask that
transforms scores (`Mask.transforms_scores`) runs the reference math on that same grid instead:

    scores = q k^T * scale   (float32)  ->  every part's score term in part order  ->  blocked entries
    -> softmax -> blocked weights 0 -> @ v

The backend still does its own work around it (only valid slices, only the keys a block may see), so
a score_mod with a sliding window at 8k keys stays banded. Exact like the reference backend: keys no
query may see are zeroed first (inert), rows that keep no key are exactly 0 with zero gradient.
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.nn.functional as F

from multihead.backends.problem import Problem
from multihead.backends.reference import attention_weights, repeat_kv, zero_where
from multihead.masks import Index, Mask

# appended to a backend's description when this path runs (mh.dispatch says what ran)
SCORED_NOTE = ("; the mask's score_mod changes the scores, which no fused SDPA kernel takes, so each {grid} "
               "runs the reference math (matmul + float32 softmax + matmul) instead of the kernel")


def transforms_scores(mask: Mask | None) -> bool:
    """Whether the mask has a part whose score term is a function (Mask.score_mod); static, no values read."""
    return mask is not None and mask.transforms_scores


def scored_note(p: Problem, grid: str) -> str:
    """SCORED_NOTE for a problem whose mask transforms scores, else ""; grid names what runs separately."""
    return SCORED_NOTE.format(grid=grid) if transforms_scores(p.mask) else ""


def reference_on_grid(q, k, v, mask: Mask, ix: Index, dropout: float, scale: float, gqa: bool) -> torch.Tensor:
    """The reference math on one grid: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> (B, H, Lq, Dv).

    ix: the grid's Index. Per-row constants are kept (a score function need not ignore them).
    """
    if ix.rows_may_shift:
        ix = replace(ix, rows_may_shift=False)
    visible = mask.key_keep(ix)  # (B, 1, 1, Lk) or None
    if visible is not None:
        hidden = ~visible.transpose(-1, -2)  # (B, 1, Lk, 1)
        k, v = zero_where(hidden, k), zero_where(hidden, v)
    keep, score_fn = mask.score_terms(ix, torch.promote_types(q.dtype, torch.float32))
    weights = attention_weights(q, k, keep, score_fn, scale)  # (B, H, Lq, Lk)
    if dropout:
        weights = F.dropout(weights, dropout)
    return weights.to(v.dtype) @ (repeat_kv(v, q.shape[1]) if gqa else v)
