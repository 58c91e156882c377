"""Mask.chunks: block-diagonal attention by position chunk (Llama 4's chunked layers).

Query i keeps key j when both lie in the same chunk of `size` positions: i // size == j // size, with
i the query's position under `align` (see Mask.causal). Combined with causal, each query sees the
keys from its chunk's start up to itself, so the work per query is at most `size` keys.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.masks.causal import check_align
from multihead.masks.index import Index
from multihead.masks.intervals import bounds, within
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part
from multihead.masks.window import check_size


@dataclass(frozen=True, eq=False)
class ChunksPart(Part):
    """Keys in the query's chunk: j // size == p // size, p under `align`."""

    size: int
    align: str = "top_left"

    def keep(self, ix: Index) -> torch.Tensor:
        return within(ix.k, *bounds(ix.query_position(self.align), chunk=self.size))  # (.., Lq, Lk)

    def fold(self, form: Fold) -> None:
        form.positional(self, self.align, chunk=self.size)

    def describe(self) -> str:
        return f"chunks({self.size}, {self.align})"


def chunks_part(size: int, align: str = "top_left") -> ChunksPart:
    """Chunked attention: query i keeps keys j in its own chunk of `size` positions (i // size == j // size)."""
    check_size(size, "Mask.chunks")
    check_align(align, "Mask.chunks")
    return ChunksPart(size, align)
