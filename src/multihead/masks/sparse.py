"""Mask.sparse: each query keeps only the keys it lists (token-sparse attention: DeepSeek V3.2's indexer).

    indices (B, Lq, K) or (B, H, Lq, K) int32/int64: indices[b, (h,) i] lists the keys query i may see;
    -1 is a free slot (FlashMLA's and vLLM's convention). A key listed twice is kept once.

Shapes: B batch, H heads, Lq queries, Lk keys, K listed keys per query.

On the whole grid the keep is scattered from the lists, (B, 1 or H, Lq, Lk); on a slice or a block of
consecutive keys the lists are scattered relative to its first key; at Flex's scalar points (and on any
other grid) a key is kept where some slot of its query lists it. The sparse backend reads the part from
the normal form's `sparse` slot and gathers the listed rows instead (backends/sparse.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part
from multihead.masks.values import values_checkable


@dataclass(frozen=True, eq=False)
class SparsePart(Part):
    """The listed keys of each query; see the module docstring."""

    indices: torch.Tensor

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        t = self.indices
        heads_ok = t.dim() == 3 or t.shape[1] in (1, H)
        if t.shape[0] not in (1, B) or t.shape[-2] != Lq or not heads_ok:
            raise AttentionError(f"Mask.sparse indices have shape {shape_str(t.shape)}; expected (B={B}, Lq={Lq}, K) "
                                 f"or (B={B}, H={H}, Lq={Lq}, K).")
        if t.numel() and values_checkable(t):  # one host read on the CPU; none on accelerators or compiled
            low, high = int(t.min()), int(t.max())
            if low < -1 or high >= Lk:
                raise AttentionError(f"Mask.sparse indices must lie in [-1, {Lk}) (Lk={Lk} keys, -1 = none); got "
                                     f"values from {low} to {high}.")

    def lists(self) -> torch.Tensor:
        """The indices as (B or 1, H or 1, Lq, K)."""
        t = self.indices
        return t[:, None] if t.dim() == 3 else t

    def rows(self, ix: Index) -> torch.Tensor:
        """The lists of the grid's (batch row, head, query) entries: (..., K), broadcast like b, h, q."""
        t = self.lists()
        if ix.whole:
            return t
        b, h, q, _ = ix.indices()
        if q.dim() == 0:  # a Flex point: scalars index one list, (K,)
            return t[b if t.shape[0] != 1 else 0, h if t.shape[1] != 1 else 0, q]
        b, h, q = (x.reshape(x.shape[:3]) for x in (b, h, q))  # (B', 1, 1), (1, H', 1), (1, 1, Lq')
        b = b if t.shape[0] != 1 else torch.zeros_like(b[:1])
        h = h if t.shape[1] != 1 else torch.zeros_like(h[:, :1])
        return t[b, h, q]  # (B', H', Lq', K)

    def keep(self, ix: Index) -> torch.Tensor:
        rows = self.rows(ix)
        if ix.k.dim() == 0:  # a Flex point
            return (rows == ix.k).any(-1)
        if ix.whole or ix.key_run:  # one run of consecutive keys from the first
            first = 0 if ix.whole else ix.k.reshape(-1)[:1]
            at = rows.long() - first
            inside = (at >= 0) & (at < ix.Lk)
            slots = torch.where(inside, at, ix.Lk)  # free slots and keys off this grid land in a spare column
            keep = torch.zeros(*rows.shape[:-1], ix.Lk + 1, dtype=torch.bool, device=rows.device)
            return keep.scatter_(-1, slots, True)[..., :ix.Lk]  # (.., Lq, Lk)
        lead = torch.broadcast_shapes(rows.shape[:-1], ix.k.shape[:-1])  # any other grid: is each key in its
        listed = rows.sort(-1).values.expand(*lead, rows.shape[-1]).contiguous()  # query's sorted list?
        keys = ix.k.expand(*lead, ix.k.shape[-1]).to(listed.dtype).contiguous()
        at = torch.searchsorted(listed, keys).clamp_max(listed.shape[-1] - 1)
        return (listed.gather(-1, at) == keys) & (keys >= 0)

    def fold(self, form: Fold) -> None:
        form.sparse(self)

    def describe(self) -> str:
        return f"sparse{shape_str(self.indices.shape)}"


def sparse_part(indices) -> SparsePart:
    """The part for Mask.sparse, its dtype and rank checked (values: at the call, against Lk)."""
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64):
        got = f"a {indices.dtype} tensor" if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise AttentionError(f"Mask.sparse expects int32 or int64 key indices (B, Lq, K) or (B, H, Lq, K), -1 = "
                             f"none; got {got}.")
    if indices.dim() not in (3, 4):
        raise AttentionError(f"Mask.sparse expects indices (B, Lq, K) or (B, H, Lq, K); got "
                             f"{shape_str(indices.shape)}.")
    return SparsePart(indices)
