"""Mask.alibi: ALiBi's linear bias -slope[h] * (i - j), added to the scores, kept lazy."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks.causal import check_align
from multihead.masks.index import Index
from multihead.masks.mask import Mask, Part, mask_constructor


@dataclass(frozen=True, eq=False)
class AlibiPart(Part):
    """Per-head slopes (H,): adds -slope[h] * (i - j), i the query position under `align`.

    Softmax ignores a term that is constant along a row, so where the backend allows it
    (`Index.rows_may_shift`) the bias is slope[h] * (j - Lk) of shape (1, H, 1, Lk): no (Lq, Lk) grid.
    """

    slopes: torch.Tensor
    align: str = "top_left"
    tensor_fields = ("slopes",)

    def check(self, B, H, Lq, Lk, device) -> None:
        super().check(B, H, Lq, Lk, device)
        if tuple(self.slopes.shape) != (H,):
            raise AttentionError(f"Mask.alibi slopes have shape {shape_str(self.slopes.shape)}; expected (H={H},).")

    def bias(self, ix: Index, dtype: torch.dtype) -> torch.Tensor:
        slopes = ix.dense(self.slopes.to(dtype).view(1, -1, 1, 1))  # (1, H, 1, 1)
        if ix.rows_may_shift:
            return slopes * (ix.k - ix.Lk).to(dtype)  # (1, H, 1, Lk): the row constant dropped
        return -slopes * (ix.query_position(self.align) - ix.k).to(dtype)  # (1 or B, H, Lq, Lk)

    def describe(self) -> str:
        return f"alibi{shape_str(self.slopes.shape)}"


@mask_constructor
def alibi(cls, slopes, align: str = "top_left") -> Mask:
    """ALiBi: adds -slopes[h] * (i - j) to the scaled scores; slopes (H,), e.g. mh.alibi_slopes(H)."""
    slopes = torch.as_tensor(slopes)
    if slopes.dim() != 1 or not slopes.is_floating_point():
        raise AttentionError(
            f"Mask.alibi expects float slopes of shape (H,); got {slopes.dtype} of shape {shape_str(slopes.shape)}."
        )
    check_align(align, "Mask.alibi")
    return cls((AlibiPart(slopes, align),))
