"""Dense bool masks: Mask.keep (True = may attend), Mask.block (True = blocked), Mask.key_padding."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index
from multihead.masks.mask import Mask, Part, check_broadcast, mask_constructor, values_checkable


@dataclass(frozen=True, eq=False)
class KeepPart(Part):
    """A bool keep tensor (True = may attend), broadcastable to (B, H, Lq, Lk)."""

    keep_tensor: torch.Tensor
    given_as: str = ""  # "key_padding": built from a (B, Lk) padding mask, reported in that shape
    tensor_fields = ("keep_tensor",)

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        t = self.keep_tensor
        if self.given_as == "key_padding" and not (t.shape[0] in (1, B) and t.shape[-1] == Lk):
            raise AttentionError(f"Mask.key_padding mask has shape {shape_str((t.shape[0], t.shape[-1]))}; "
                                 f"expected (B={B}, Lk={Lk}), True = padding key.")
        check_broadcast(t, B, H, Lq, Lk)

    def keep(self, ix: Index) -> torch.Tensor:
        return ix.dense(self.keep_tensor)

    def key_keep(self, ix: Index) -> torch.Tensor | None:
        if not self.blocks_only_keys():
            return None
        t = self.keep_tensor
        return ix.dense(t.view((1,) * (4 - t.dim()) + tuple(t.shape)))  # (B or 1, 1, 1, Lk)

    def blocks_only_keys(self) -> bool:
        t = self.keep_tensor  # one row for every query (dim -2) and every head (dim -3)
        return not (t.dim() >= 2 and t.shape[-2] != 1 or t.dim() >= 3 and t.shape[-3] != 1)

    def describe(self) -> str:
        return f"keep{shape_str(self.keep_tensor.shape)}"


def as_bool(t, who: str) -> torch.Tensor:
    """A bool tensor from bool or 0/1 numbers; AttentionError for anything else."""
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
    return t != 0


@mask_constructor
def keep(cls, t) -> Mask:
    """True / 1 = may attend. Bool or 0/1 numeric, broadcastable to (B, H, Lq, Lk)."""
    return cls((KeepPart(as_bool(t, "Mask.keep")),))


@mask_constructor
def block(cls, t) -> Mask:
    """True / 1 = must not attend. Bool or 0/1 numeric, broadcastable to (B, H, Lq, Lk)."""
    return cls((KeepPart(~as_bool(t, "Mask.block")),))


@mask_constructor
def key_padding(cls, t) -> Mask:
    """(B, Lk), True / 1 = padding key (the torch convention)."""
    pad = as_bool(t, "Mask.key_padding")
    if pad.dim() != 2:
        raise AttentionError(f"Mask.key_padding expects shape (B, Lk); got {shape_str(pad.shape)}.")
    return cls((KeepPart(~pad[:, None, None, :], "key_padding"),))  # (B, 1, 1, Lk)
