"""Mask.window: a sliding window (Mistral), key j is kept when i - size < j."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError
from multihead.masks.causal import check_align
from multihead.masks.index import Index
from multihead.masks.intervals import bounds, within
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part


@dataclass(frozen=True, eq=False)
class WindowPart(Part):
    """Keys j > p - size, with p the query's position under `align` (see Mask.causal)."""

    size: int
    align: str = "top_left"

    def keep(self, ix: Index) -> torch.Tensor:
        return within(ix.k, *bounds(ix.query_position(self.align), left=self.size - 1))  # (.., Lq, Lk)

    def fold(self, form: Fold) -> None:
        form.positional(self, self.align, left=self.size - 1)

    def describe(self) -> str:
        return f"window({self.size}, {self.align})"


def check_size(size, who: str) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise AttentionError(f"{who} size must be a positive int; got {size!r}.")


def window_part(size: int, align: str = "top_left") -> WindowPart:
    """Sliding window: query i keeps keys j > i - size (with causal: the last `size` keys up to i)."""
    check_size(size, "Mask.window")
    check_align(align, "Mask.window")
    return WindowPart(size, align)
