"""Mask.mask_mod: a user's keep function, FlexAttention's mask_mod signature.

    fn(b, h, q_idx, kv_idx) -> bool tensor, True = may attend

The indices are integer tensors that broadcast together (`Index.indices`): on the whole grid
b (B, 1, 1, 1), h (1, H, 1, 1), q_idx (1, 1, Lq, 1), kv_idx (1, 1, 1, Lk); on a length-aware slice or
a banded block the row and absolute positions of that piece; under flex_attention the scalar tensors
flex passes. So one function written with tensor operations (comparisons, indexing captured tensors
with the indices) runs on every backend.

Tensors the function captures are not pytree leaves: torch.compile traces into the function and
reads them as it reads any captured tensor (it guards on their identity). The mask cannot see them,
so the forms made from it are rebuilt on every call rather than remembered. Pytree: the function is static context.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from multihead.errors import AttentionError
from multihead.masks.index import Index
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part


TRUTH_OF_TENSOR = ("Boolean value of Tensor", "data-dependent control flow")   # eager; under vmap (flex)


class MaskModTruthError(AttentionError, RuntimeError):
    """A mask_mod used `and`/`or`/`not`/`if` on its index tensors: an AttentionError that stays the
    RuntimeError torch raises for it, so code catching torch's error still catches this one."""


def asks_truth_of_tensor(exc: RuntimeError) -> bool:
    """Whether torch raised `exc` because Python asked a tensor of several values for True or False."""
    return any(text in str(exc) for text in TRUTH_OF_TENSOR)


@dataclass(frozen=True, eq=False)
class MaskModPart(Part):
    """Keys kept where fn(b, h, q_idx, kv_idx) is True; see the module docstring."""

    fn: Callable[..., torch.Tensor]

    def keep(self, ix: Index) -> torch.Tensor:
        try:
            out = self.fn(*ix.indices())
        except RuntimeError as exc:
            if not asks_truth_of_tensor(exc):
                raise
            raise MaskModTruthError(
                f"Mask.mask_mod's function {function_name(self.fn)!r} asked Python for the truth of a tensor "
                f"(`and`, `or`, `not` or `if` on index tensors; torch: \"{exc}\"). The indices are tensors: "
                "combine conditions with `&`, `|` and `~`, e.g. (q_idx >= kv_idx) & (q_idx - kv_idx < 4), "
                "and choose with torch.where instead of `if`.") from exc
        if not isinstance(out, torch.Tensor) or out.dtype != torch.bool:
            got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
            raise AttentionError(f"Mask.mask_mod's function must return a bool tensor (True = may attend); got {got}.")
        return out

    def fold(self, form: Fold) -> None:
        form.residual(self, calls_user=True)

    def describe(self) -> str:
        return f"mask_mod({function_name(self.fn)})"


def function_name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def check_callable(fn, who: str) -> None:
    if not callable(fn):
        raise AttentionError(f"{who} expects a function; got {type(fn).__name__}.")


def mask_mod_part(fn: Callable[..., torch.Tensor]) -> MaskModPart:
    """Keys kept where fn(b, h, q_idx, kv_idx) is True (FlexAttention's mask_mod; integer index tensors)."""
    check_callable(fn, "Mask.mask_mod")
    return MaskModPart(fn)
