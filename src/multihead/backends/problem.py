"""Problem: one validated attention call, the unit every backend receives."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.masks import Mask


@dataclass(frozen=True, eq=False)
class Problem:
    """q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); mask already includes `causal=True`."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: Mask | None
    scale: float
    dropout: float

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(B, H, Lq, Lk)."""
        B, H, Lq, _ = self.q.shape
        return B, H, Lq, self.k.shape[-2]

    @property
    def gqa(self) -> bool:
        return self.k.shape[1] != self.q.shape[1]

    def dense_mask(self, dtype=None):
        """(keep, bias) broadcastable to (B, H, Lq, Lk), or (None, None) without a mask.

        bias is in `dtype`, by default the softmax dtype: the input dtype promoted to at least float32.
        """
        if self.mask is None:
            return None, None
        dtype = dtype or torch.promote_types(self.q.dtype, torch.float32)
        B, H, Lq, Lk = self.dims
        return self.mask.dense(Lq, Lk, device=self.q.device, dtype=dtype)  # validated in make_problem
