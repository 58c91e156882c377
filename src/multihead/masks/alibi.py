"""Mask.alibi: ALiBi's linear bias -slope[h] * (i - j), added to the scores, kept lazy."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.causal import check_align
from multihead.masks.index import Index
from multihead.masks.normal_form import Fold
from multihead.masks.part import Part


@dataclass(frozen=True, eq=False)
class AlibiPart(Part):
    """Per-head slopes (H,): adds -slope[h] * (i - j), i the query position under `align`.

    Softmax ignores a term that is constant along a row, so on the whole grid, where the backend allows it
    (`Index.rows_may_shift`) and the bias is wanted in float32 or wider, it is slope[h] * (j - Lk) of
    shape (1, H, 1, Lk): no (Lq, Lk) grid. Elsewhere (a slice, a block: small grids whose keys sit far from
    0, where the shifted terms would be large and round) and in bf16 / fp16 it is built from absolute
    distances in float32 and cast once.
    """

    slopes: torch.Tensor
    align: str = "top_left"

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        if tuple(self.slopes.shape) != (H,):
            raise AttentionError(f"Mask.alibi slopes have shape {shape_str(self.slopes.shape)}; expected (H={H},).")

    def bias(self, ix: Index, dtype: torch.dtype) -> torch.Tensor:
        work = torch.promote_types(dtype, torch.float32)  # built in the softmax dtype, at least float32
        slopes = ix.dense(self.slopes.to(work).view(1, -1, 1, 1))  # (1, H, 1, 1)
        if ix.rows_may_shift and ix.whole and work == dtype:  # dropping the row constant: float32+, whole grid
            return slopes * (ix.k - ix.Lk).to(work)  # (1, H, 1, Lk)
        # from absolute distances: the keys near each query get small, exactly representable biases
        # even when cast to bf16 / fp16 (a shifted bias would round their differences away)
        return (-slopes * (ix.query_position(self.align) - ix.k).to(work)).to(dtype)  # (1 or B, H, Lq, Lk)

    def fold(self, form: Fold) -> None:
        form.alibi(self, self.slopes, self.align)

    def describe(self) -> str:
        return f"alibi{shape_str(self.slopes.shape)}"


def alibi_part(slopes, align: str = "top_left") -> AlibiPart:
    """ALiBi: adds -slopes[h] * (i - j) to the scaled scores; slopes (H,), e.g. mh.alibi_slopes(H)."""
    slopes = torch.as_tensor(slopes)
    if slopes.dim() != 1 or not slopes.is_floating_point():
        raise AttentionError(
            f"Mask.alibi expects float slopes of shape (H,); got {slopes.dtype} of shape {shape_str(slopes.shape)}."
        )
    check_align(align, "Mask.alibi")
    return AlibiPart(slopes, align)
