"""Mask.window: a sliding window (Mistral), key j is kept when i - size < j."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError
from multihead.masks.causal import check_align, host_offset
from multihead.masks.index import Index
from multihead.masks.mask import Mask, Part, mask_constructor


@dataclass(frozen=True, eq=False)
class WindowPart(Part):
    """Keys j > i - size, with i the query's position under `align` (see Mask.causal)."""

    size: int
    align: str = "top_left"

    def keep(self, ix: Index) -> torch.Tensor:
        return ix.k > ix.query_position(self.align) - self.size  # (.., Lq, Lk)

    def key_span(self, q_lo: int, q_hi: int, ix: Index) -> tuple[int, int] | None:
        offset = host_offset(self.align, ix)
        return None if offset is None else (max(0, q_lo + offset - self.size + 1), ix.Lk)

    def key_interval(self, ix: Index, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.maximum(lo, ix.row_positions(self.align) - self.size + 1), hi  # keys j > i - size

    def describe(self) -> str:
        return f"window({self.size}, {self.align})"


@mask_constructor
def window(cls, size: int, align: str = "top_left") -> Mask:
    """Sliding window: query i keeps keys j > i - size (with causal: the last `size` keys up to i).

    align: "top_left" (positions from 0) or "bottom_right" (each sequence's last valid query at its
    last valid key, as in decoding with a KV cache).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise AttentionError(f"Mask.window size must be a positive int; got {size!r}.")
    check_align(align, "Mask.window")
    return cls((WindowPart(size, align),))
