"""Mask.score_mod: a user's score function, FlexAttention's score_mod signature.

    fn(score, b, h, q_idx, kv_idx) -> score

score is q . k * scale (after softcap, and after the terms of the parts before this one, in part
order), in the softmax dtype (at least float32); the indices are as in Mask.mask_mod. The result may
be any float tensor that broadcasts with score; it is taken back to score's dtype.

Every backend is exact with it: flex passes it inside its own score_mod; the reference math applies
it to the dense scores; sdpa, varlen and banded run the reference math on each grid they would have
given the fused kernel (the whole grid, each valid slice, each block), since no fused SDPA kernel
takes a score function. Gradients reach every tensor the function captures (a learnable bias table).
Captured tensors are not pytree leaves (see mask_mod.py): torch.compile traces into the function.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from multihead.errors import AttentionError
from multihead.masks.index import Index
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part
from multihead.masks.mask_mod import check_callable, function_name


@dataclass(frozen=True, eq=False)
class ScoreModPart(Part):
    """Scores -> fn(score, b, h, q_idx, kv_idx); see the module docstring."""

    fn: Callable[..., torch.Tensor]

    def score(self, s: torch.Tensor, ix: Index) -> torch.Tensor:
        out = self.fn(s, *ix.indices())
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            got = out.dtype if isinstance(out, torch.Tensor) else type(out).__name__
            raise AttentionError(f"Mask.score_mod's function must return a float tensor of scores; got {got}.")
        return out.to(s.dtype)

    def fold(self, form: Fold) -> None:
        form.residual(self, scores=True, calls_user=True)

    def describe(self) -> str:
        return f"score_mod({function_name(self.fn)})"


def score_mod_part(fn: Callable[..., torch.Tensor]) -> ScoreModPart:
    """Scores become fn(score, b, h, q_idx, kv_idx) (FlexAttention's score_mod; integer index tensors)."""
    check_callable(fn, "Mask.score_mod")
    return ScoreModPart(fn)
