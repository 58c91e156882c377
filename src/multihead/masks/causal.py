"""Mask.causal: query i sees keys j <= i, aligned top-left or bottom-right."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError
from multihead.masks.index import Index
from multihead.masks.mask import Mask, Part, mask_constructor

ALIGNS = ("top_left", "bottom_right")


def check_align(align, who: str) -> None:
    if align not in ALIGNS:
        raise AttentionError(f"{who} align must be one of {ALIGNS}; got {align!r}.")


@dataclass(frozen=True, eq=False)
class CausalPart(Part):
    """Keys j <= i + offset: offset 0 (top-left) or each sequence's valid keys - valid queries."""

    align: str = "top_left"

    def keep(self, ix: Index) -> torch.Tensor | None:
        if self._keeps_all(ix):
            return None
        return ix.k <= ix.query_position(self.align)  # (.., Lq, Lk)

    def is_causal(self, ix: Index) -> bool:
        if not ix.plain or self._keeps_all(ix):
            return False
        return self.align == "top_left" or (isinstance(ix.q_extent, int) and isinstance(ix.k_extent, int)
                                            and ix.q_extent == ix.k_extent == ix.Lq == ix.Lk)

    def key_span(self, q_lo: int, q_hi: int, ix: Index) -> tuple[int, int] | None:
        offset = host_offset(self.align, ix)
        return None if offset is None else (0, max(0, q_hi + offset))

    def key_interval(self, ix: Index, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self._keeps_all(ix):  # a decode step's one bottom-right query: every valid key
            return lo, hi
        return lo, torch.minimum(hi, ix.row_positions(self.align) + 1)  # keys j <= i

    def _keeps_all(self, ix: Index) -> bool:
        """One bottom-right query at the last valid key sees every valid key (a decode step)."""
        return self.align == "bottom_right" and isinstance(ix.q_extent, int) and ix.q_extent == 1

    def describe(self) -> str:
        return f"causal({self.align})"


def host_offset(align: str, ix: Index) -> int | None:
    """The alignment's query offset as a host int; None when it differs per sequence (tensor extents)."""
    if align == "top_left":
        return 0
    if isinstance(ix.q_extent, int) and isinstance(ix.k_extent, int):
        return ix.k_extent - ix.q_extent
    return None


@mask_constructor
def causal(cls, align: str = "top_left") -> Mask:
    """Query i sees keys j <= i (top_left), or the last valid query of each sequence lines up with its
    last valid key (bottom_right: j <= i + klen - qlen, per sequence when Mask.lengths gives lengths)."""
    check_align(align, "Mask.causal")
    return cls((CausalPart(align),))
