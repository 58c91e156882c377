"""Mask.segments: packed sequences (document masking), attend only within the same segment id."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index
from multihead.masks.mask import Mask, Part, mask_constructor


@dataclass(frozen=True, eq=False)
class SegmentsPart(Part):
    """Query i of row b keeps key j when query_ids[b, i] == key_ids[b, j]."""

    query_ids: torch.Tensor
    key_ids: torch.Tensor
    tensor_fields = ("query_ids", "key_ids")

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        for name, t, L in (("query ids", self.query_ids, Lq), ("key ids", self.key_ids, Lk)):
            if tuple(t.shape) != (B, L):
                raise AttentionError(f"Mask.segments {name} have shape {shape_str(t.shape)}; expected ({B}, {L}).")

    def keep(self, ix: Index) -> torch.Tensor:
        return ix.per_query(self.query_ids) == ix.per_key(self.key_ids)  # (B, 1, Lq, Lk)

    def can_slice(self) -> bool:
        return True

    def slices(self, Lq: int, Lk: int):
        out = []
        for b, (q_ids, k_ids) in enumerate(zip(self.query_ids.tolist(), self.key_ids.tolist())):
            q_runs, k_runs = _runs(q_ids), _runs(k_ids)
            if q_runs is None or k_runs is None:
                return "a segment id appears in more than one run of a row; the dense path takes those"
            out += [(b, q_lo, q_hi) + k_runs[i] for i, (q_lo, q_hi) in q_runs.items() if i in k_runs]
        return out

    def describe(self) -> str:
        return f"segments{shape_str(self.query_ids.shape)}"


@mask_constructor
def segments(cls, ids, key_ids=None) -> Mask:
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
    return cls((SegmentsPart(q, k),))


def _runs(ids: list[int]) -> dict[int, tuple[int, int]] | None:
    """{id: (start, end)} of each run of equal ids; None when an id comes back after another."""
    runs: dict[int, tuple[int, int]] = {}
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[start]:
            if ids[start] in runs:
                return None
            runs[ids[start]] = (start, i)
            start = i
    return runs
