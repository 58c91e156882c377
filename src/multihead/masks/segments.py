"""Mask.segments: packed sequences (document masking), attend only within the same segment id."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part


@dataclass(frozen=True, eq=False)
class SegmentsPart(Part):
    """Query i of row b keeps key j when query_ids[b, i] == key_ids[b, j]."""

    query_ids: torch.Tensor
    key_ids: torch.Tensor

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        for name, t, L in (("query ids", self.query_ids, Lq), ("key ids", self.key_ids, Lk)):
            if tuple(t.shape) != (B, L):
                raise AttentionError(f"Mask.segments {name} have shape {shape_str(t.shape)}; expected ({B}, {L}).")

    def keep(self, ix: Index) -> torch.Tensor:
        return ix.per_query(self.query_ids) == ix.per_key(self.key_ids)  # (B, 1, Lq, Lk)

    def fold(self, form: Fold) -> None:
        form.segments(self, self.query_ids, self.key_ids)

    def describe(self) -> str:
        return f"segments{shape_str(self.query_ids.shape)}"


def segments_part(ids, key_ids=None) -> SegmentsPart:
    """Packed sequences: ids (B, L) give each token's segment; tokens attend within their segment.

    For cross-attention pass the query ids (B, Lq) and the key ids (B, Lk).
    """
    q = torch.as_tensor(ids)
    k = q if key_ids is None else torch.as_tensor(key_ids)
    for name, t in (("ids", q), ("key_ids", k)):
        if t.dim() != 2 or t.is_floating_point() or t.is_complex():
            raise AttentionError(
                f"Mask.segments {name} must be integer (B, L); got {t.dtype} of shape {shape_str(t.shape)}."
            )
    if q.shape[0] != k.shape[0]:
        raise AttentionError(f"Mask.segments query ids have batch {q.shape[0]} but key ids have {k.shape[0]}.")
    return SegmentsPart(q, k)

