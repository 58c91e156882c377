"""Mask.chunks: block-diagonal attention by position chunk (Llama 4's chunked layers).

Query i keeps key j when both lie in the same chunk of `size` positions: i // size == j // size, with
i the query's position under `align` (see Mask.causal). Combined with causal, each query sees the
keys from its chunk's start up to itself, so the work per query is at most `size` keys.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError
from multihead.masks.causal import check_align, host_offset
from multihead.masks.index import Index
from multihead.masks.mask import Mask, Part, mask_constructor


@dataclass(frozen=True, eq=False)
class ChunksPart(Part):
    """Keys in the query's chunk: j // size == i // size, i under `align`."""

    size: int
    align: str = "top_left"

    def keep(self, ix: Index) -> torch.Tensor:
        chunk_of_query = torch.div(ix.query_position(self.align), self.size, rounding_mode="floor")  # (.., Lq, 1)
        return torch.div(ix.k, self.size, rounding_mode="floor") == chunk_of_query  # (.., Lq, Lk)

    def key_span(self, q_lo: int, q_hi: int, ix: Index) -> tuple[int, int] | None:
        offset = host_offset(self.align, ix)
        if offset is None or q_hi <= q_lo:
            return None if offset is None else (0, 0)
        first = (q_lo + offset) // self.size * self.size
        last = ((q_hi - 1 + offset) // self.size + 1) * self.size
        return max(0, first), min(ix.Lk, max(0, last))

    def key_interval(self, ix: Index, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start = torch.div(ix.row_positions(self.align), self.size, rounding_mode="floor") * self.size  # (B, Lq)
        return torch.maximum(lo, start), torch.minimum(hi, start + self.size)  # the query's own chunk

    def describe(self) -> str:
        return f"chunks({self.size}, {self.align})"


@mask_constructor
def chunks(cls, size: int, align: str = "top_left") -> Mask:
    """Chunked attention: query i keeps keys j in its own chunk of `size` positions (i // size == j // size).

    Combine with causal (Llama 4's chunked layers). align: "top_left" (positions from 0) or
    "bottom_right" (each sequence's last valid query at its last valid key, as with a KV cache).
    """
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise AttentionError(f"Mask.chunks size must be a positive int; got {size!r}.")
    check_align(align, "Mask.chunks")
    return cls((ChunksPart(size, align),))
