"""Mask.causal: query i sees keys j <= i, aligned top-left or bottom-right."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError
from multihead.masks.index import Index
from multihead.masks.intervals import bounds, within
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part

ALIGNS = ("top_left", "bottom_right")


def check_align(align, who: str) -> None:
    if align not in ALIGNS:
        raise AttentionError(f"{who} align must be one of {ALIGNS}; got {align!r}.")


@dataclass(frozen=True, eq=False)
class CausalPart(Part):
    """Keys j <= p: p the query's position, i (top-left) or i + valid keys - valid queries (bottom-right)."""

    align: str = "top_left"

    def keep(self, ix: Index) -> torch.Tensor:
        return within(ix.k, *bounds(ix.query_position(self.align), right=0))  # (.., Lq, Lk)

    def fold(self, form: Fold) -> None:
        form.positional(self, self.align, right=0)

    def describe(self) -> str:
        return f"causal({self.align})"


def causal_part(align: str = "top_left") -> CausalPart:
    """Query i sees keys j <= i (top_left), or the last valid query of each sequence lines up with its
    last valid key (bottom_right: j <= i + klen - qlen, per sequence when Mask.lengths gives lengths)."""
    check_align(align, "Mask.causal")
    return CausalPart(align)
