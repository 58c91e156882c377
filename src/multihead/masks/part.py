"""Part: one kind of mask or score term. A `Mask` is a tuple of parts combined with `&`.

Shapes: B batch, H heads, Lq queries, Lk keys; every part broadcasts to (B, H, Lq, Lk).

A part knows only its own meaning, in six hooks:

    check(B, H, Lq, Lk, device)  raise AttentionError unless it fits the call (shapes and devices only)
    keep(ix)                     bool, True = may attend, on the grid `ix` (an Index), or None
    bias(ix, dtype)              float added to the scaled scores, or None
    score(s, ix)                 the scores after this part's term (s + bias unless the part transforms them)
    describe()                   a short name for messages and mh.dispatch
    fold(form)                   say what kernels may take it as: one call on the Fold (normal_form.py)

Everything a backend needs beyond these comes from the normal form the parts fold into, so no
backend asks which kind a part is. Subclasses are frozen dataclasses: their tensor fields are the
Mask's pytree leaves and the tensors the plan cache keys by identity; every other field is static.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from multihead.errors import AttentionError

if TYPE_CHECKING:
    from multihead.masks.index import Index
    from multihead.masks.normal_form import Fold


class Part:
    """One kind of mask or score term; see the module docstring."""

    def check(self, B: int, H: int, Lq: int, Lk: int, device: torch.device) -> None:
        """Raise AttentionError unless the part fits (B, H, Lq, Lk) on `device`. Reads shapes, never values."""
        for t in part_tensors(self):
            if not same_device(t.device, device):
                raise AttentionError(f"mask is on {t.device} but the inputs are on {device}.")

    def keep(self, ix: Index) -> torch.Tensor | None:
        """Bool, True = may attend, broadcastable to the grid; None when the part blocks nothing."""
        return None

    def bias(self, ix: Index, dtype: torch.dtype) -> torch.Tensor | None:
        """Float added to the scaled scores, broadcastable to the grid; None when the part adds nothing."""
        return None

    def score(self, s: torch.Tensor, ix: Index) -> torch.Tensor:
        """The scores (broadcastable to the grid, softmax dtype) after this part's term: s + bias by default."""
        b = self.bias(ix, s.dtype)
        return s if b is None else s + b

    def describe(self) -> str:
        return type(self).__name__

    def fold(self, form: Fold) -> None:
        """Tell `form` what this part is in kernel terms; by default a residual term evaluated densely."""
        form.residual(self)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # each kind's dataclass field names, found once (eager)


def part_fields(part: Part) -> tuple[tuple[str, object], ...]:
    """((name, value), ...) of the part's dataclass fields, in order."""
    if torch.compiler.is_compiling():  # nothing remembered is read under torch.compile (no guards on it)
        return tuple((f.name, getattr(part, f.name)) for f in dataclasses.fields(part))
    names = _FIELD_NAMES.get(type(part))
    if names is None:
        names = _FIELD_NAMES[type(part)] = tuple(f.name for f in dataclasses.fields(part))
    return tuple((n, getattr(part, n)) for n in names)


def part_tensors(part: Part) -> tuple[torch.Tensor, ...]:
    """The part's tensor fields (those that hold a tensor), in field order; found once per part (eager)."""
    if torch.compiler.is_compiling():  # nothing remembered is read under torch.compile (no guards on it)
        return tuple(v for _, v in part_fields(part) if isinstance(v, torch.Tensor))
    found = part.__dict__.get("_tensors")
    if found is None:
        found = tuple(v for _, v in part_fields(part) if isinstance(v, torch.Tensor))
        object.__setattr__(part, "_tensors", found)  # a frozen part's cache: not a field, not a pytree leaf
    return found


def same_device(a: torch.device, b) -> bool:
    """Whether two devices are the same one ("cuda" and "cuda:0" are, for the current device)."""
    if a == b:
        return True
    b = torch.device(b)
    return a.type == b.type and (a.index == b.index or None in (a.index, b.index))
