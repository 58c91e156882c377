"""Mask.lengths: d2l's valid_lens, and padded queries (query_lens)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index
from multihead.masks.intervals import bounds, within
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part
from multihead.masks.values import values_checkable


@dataclass(frozen=True, eq=False)
class LengthsPart(Part):
    """Valid key counts (B,) or (B, Lq); optional valid query counts (B,). Padding queries keep nothing."""

    key_lens: torch.Tensor
    query_lens: torch.Tensor | None = None

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        lens, q = self.key_lens, self.query_lens
        expected = (B,) if lens.dim() == 1 else (B, Lq)
        if tuple(lens.shape) != expected:
            raise AttentionError(
                f"valid_lens shape {shape_str(lens.shape)} does not match (B={B},) or (B={B}, Lq={Lq})."
            )
        if q is not None and tuple(q.shape) != (B,):
            raise AttentionError(f"query_lens shape {shape_str(q.shape)} does not match (B={B},).")
        if values_checkable(lens) and lens.numel() and int(lens.max()) > Lk:
            raise AttentionError(f"valid_lens must be <= Lk={Lk}; got a maximum of {int(lens.max())}.")
        if q is not None and values_checkable(q) and q.numel() and int(q.max()) > Lq:
            raise AttentionError(f"query_lens must be <= Lq={Lq}; got a maximum of {int(q.max())}.")

    def keep(self, ix: Index) -> torch.Tensor:
        lens = self.key_lens
        keep = within(ix.k, *bounds(0, key_len=ix.per_batch(lens) if lens.dim() == 1 else ix.per_query(lens)))
        if self.query_lens is not None:
            keep = keep & (ix.q < ix.per_batch(self.query_lens))  # padded queries keep nothing
        return keep  # (B, 1, Lq or 1, Lk)

    def fold(self, form: Fold) -> None:
        form.lengths(self, self.key_lens, self.query_lens)

    def describe(self) -> str:
        q = "" if self.query_lens is None else f", query_lens{shape_str(self.query_lens.shape)}"
        return f"lengths{shape_str(self.key_lens.shape)}{q}"


def as_lengths(t, name: str, ndims: tuple[int, ...]) -> torch.Tensor:
    """An integer tensor of counts, with the dims, dtype and (where free to read) values checked."""
    if isinstance(t, bool) or (isinstance(t, torch.Tensor) and t.dtype == torch.bool):
        raise AttentionError(f"{name} must hold integer counts; got a bool.")
    t = torch.as_tensor(t)
    if t.dim() not in ndims:
        expected = " or ".join("(B,)" if n == 1 else "(B, Lq)" for n in ndims)
        raise AttentionError(f"{name} must have shape {expected}; got {shape_str(t.shape)}.")
    if t.is_complex():
        raise AttentionError(f"{name} must hold integer counts; got dtype {t.dtype}.")
    if t.is_floating_point():
        if values_checkable(t) and not bool((t == t.round()).all()):
            raise AttentionError(f"{name} must hold whole numbers of positions; got fractional values.")
        t = t.long()
    if values_checkable(t) and t.numel() and int(t.min()) < 0:
        raise AttentionError(f"{name} must be >= 0; got a minimum of {int(t.min())}.")
    return t


def lengths_part(valid_lens, query_lens=None) -> LengthsPart:
    """Keys j < valid_lens[b] (or [b, i]) are kept (d2l); queries i >= query_lens[b] are padding."""
    key_lens = as_lengths(valid_lens, "valid_lens", ndims=(1, 2))
    q_lens = None if query_lens is None else as_lengths(query_lens, "query_lens", ndims=(1,))
    if q_lens is not None and q_lens.shape[0] != key_lens.shape[0]:
        raise AttentionError(
            f"query_lens has {q_lens.shape[0]} entries but valid_lens has {key_lens.shape[0]}; "
            "expected one per batch element."
        )
    if q_lens is not None and q_lens.device != key_lens.device:
        raise AttentionError(f"query_lens is on {q_lens.device} but valid_lens is on {key_lens.device}.")
    return LengthsPart(key_lens, q_lens)
