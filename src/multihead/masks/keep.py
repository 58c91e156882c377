"""Dense bool masks: Mask.keep (True = may attend), Mask.block (True = blocked), Mask.key_padding.

The part keeps the tensor the caller gave, as given, with the convention it was given in: the plan
cache then knows a mask rebuilt from the same tensor on every call as the same mask.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part
from multihead.masks.values import check_broadcast, values_checkable

CONVENTIONS = ("keep", "block", "key_padding")  # True / nonzero means: may attend, blocked, padding key


@dataclass(frozen=True, eq=False)
class KeepPart(Part):
    """A bool or 0/1 tensor in one of CONVENTIONS; key_padding tensors are (B, Lk), the others broadcast to
    (B, H, Lq, Lk)."""

    given: torch.Tensor
    convention: str = "keep"

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        t = self.given
        if self.convention == "key_padding" and not (t.shape[0] in (1, B) and t.shape[-1] == Lk):
            raise AttentionError(f"Mask.key_padding mask has shape {shape_str(t.shape)}; "
                                 f"expected (B={B}, Lk={Lk}), True = padding key.")
        if self.convention != "key_padding":
            check_broadcast(t, B, H, Lq, Lk)

    def keep_tensor(self) -> torch.Tensor:
        """The keep (True = may attend), broadcastable to (B, H, Lq, Lk); key padding as (B, 1, 1, Lk)."""
        t = self.given if self.given.dtype == torch.bool else self.given != 0
        if self.convention == "keep":
            return t
        t = ~t
        return t[:, None, None, :] if self.convention == "key_padding" else t

    def keep(self, ix: Index) -> torch.Tensor:
        return ix.dense(self.keep_tensor())

    def fold(self, form: Fold) -> None:
        t = self.given
        per_key = self.convention == "key_padding" or not (
            t.dim() >= 2 and t.shape[-2] != 1 or t.dim() >= 3 and t.shape[-3] != 1)  # one row for every query, head
        if per_key:
            keep = self.keep_tensor()
            form.key_keep(self, keep.view((1,) * (4 - keep.dim()) + tuple(keep.shape)))  # (B or 1, 1, 1, Lk)
        else:
            form.residual(self)

    def describe(self) -> str:
        name = "keep" if self.convention != "key_padding" else "key_padding"
        return f"{name}{shape_str(self.given.shape)}"


def as_bool(t, who: str) -> torch.Tensor:
    """A bool tensor, or a numeric one of 0/1 values (checked where reading them is free); AttentionError
    for anything else. Numbers stay as given: the part reads them as t != 0."""
    t = torch.as_tensor(t)
    if t.dtype == torch.bool:
        return t
    if t.is_complex():
        raise AttentionError(f"{who} expects a bool tensor or 0/1 values; got dtype {t.dtype}.")
    if values_checkable(t) and not bool(((t == 0) | (t == 1)).all()):
        raise AttentionError(
            f"{who} expects a bool tensor or 0/1 values; got dtype {t.dtype} with other values. "
            "For float score offsets use Mask.additive."
        )
    return t


def keep_part(t, convention: str) -> KeepPart:
    """The part for Mask.keep, Mask.block or Mask.key_padding (`convention`), its input checked."""
    who = f"Mask.{convention}"
    t = as_bool(t, who)
    if convention == "key_padding" and t.dim() != 2:
        raise AttentionError(f"Mask.key_padding expects shape (B, Lk); got {shape_str(t.shape)}.")
    return KeepPart(t, convention)
