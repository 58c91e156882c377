"""Mask.additive: a float added to the scaled scores; -inf blocks the key."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index
from multihead.masks.part import Part
from multihead.masks.values import check_broadcast, values_checkable


@dataclass(frozen=True, eq=False)
class AdditivePart(Part):
    """Float offsets broadcastable to (B, H, Lq, Lk). -inf is structure, not arithmetic: it becomes a
    blocked key (so rows stay NaN-free) and the bias there is 0."""

    offsets: torch.Tensor

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        check_broadcast(self.offsets, B, H, Lq, Lk)

    def keep(self, ix: Index) -> torch.Tensor:
        return ~torch.isneginf(ix.dense(self.offsets))

    def bias(self, ix: Index, dtype: torch.dtype) -> torch.Tensor:
        t = ix.dense(self.offsets)
        t = t.masked_fill(torch.isneginf(t), 0.0)  # blocked by keep(), not by arithmetic
        # clamped at a bound both dtypes hold, then cast: -1e9 in fp16 stays finite (never -inf), and
        # an fp16 / bf16 mask joins float32 scores (or the reverse) without an overflowing constant
        lowest = max(torch.finfo(t.dtype).min, torch.finfo(dtype).min)
        return t.clamp_min(lowest).to(dtype)

    def describe(self) -> str:
        return f"additive{shape_str(self.offsets.shape)}"


def additive_part(t) -> AdditivePart:
    """A float added to the scaled scores (broadcastable to (B, H, Lq, Lk)); -inf blocks."""
    t = torch.as_tensor(t)
    if not t.is_floating_point():
        raise AttentionError(
            f"Mask.additive expects a floating tensor of score offsets; got dtype {t.dtype}. "
            "For 0/1 or bool masks use Mask.keep (1 = attend) or Mask.block (1 = blocked)."
        )
    if values_checkable(t) and bool((torch.isnan(t) | torch.isposinf(t)).any()):
        raise AttentionError("Mask.additive expects finite values or -inf; got NaN or +inf.")
    return AdditivePart(t)
