"""Problem: one validated attention call, the unit every backend receives."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.masks import Index, Mask


@dataclass(eq=False, slots=True)
class Problem:
    """q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); mask already includes `causal=True`.

    softcap: scores -> softcap * tanh(scores / softcap) before the mask, or None.
    sinks: (H,) logits joining each row's softmax denominator (carrying no value), or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    mask: Mask | None
    scale: float
    dropout: float
    softcap: float | None = None
    sinks: torch.Tensor | None = None

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(B, H, Lq, Lk)."""
        B, H, Lq, _ = self.q.shape
        return B, H, Lq, self.k.shape[-2]

    @property
    def gqa(self) -> bool:
        """Whether k/v have fewer heads than q; a plain bool even where shapes are traced or symbolic."""
        return True if self.k.shape[1] != self.q.shape[1] else False  # noqa: SIM210 (a branch, not bool())

    @property
    def softmax_dtype(self) -> torch.dtype:
        """The input dtype promoted to at least float32."""
        return torch.promote_types(self.q.dtype, torch.float32)

    def index(self, rows_may_shift: bool = False) -> Index:
        """The whole (B, H, Lq, Lk) grid, with the mask's per-sequence extents.

        rows_may_shift: the consumer's softmax has no sinks, so per-row constants may be dropped.
        """
        B, H, Lq, Lk = self.dims
        if self.mask is None:
            return Index.grid(B, H, Lq, Lk, self.q.device, rows_may_shift)
        return self.mask.index(B, H, Lq, Lk, self.q.device, rows_may_shift)

    def dense_mask(self, dtype=None):
        """(keep, bias) broadcastable to (B, H, Lq, Lk), or (None, None) without a mask.

        bias is in `dtype`, by default the softmax dtype; with Mask.score_mod it is a function of the scores.
        """
        if self.mask is None:
            return None, None
        return self.mask.score_terms(self.index(), dtype or self.softmax_dtype)

    def weights(self) -> torch.Tensor:
        """The reference attention weights (B, H, Lq, Lk) in the softmax dtype; blocked entries exactly 0."""
        from multihead.backends.reference import attention_weights

        keep, bias = self.dense_mask()
        return attention_weights(self.q, self.k, keep, bias, self.scale, self.softcap, self.sinks)
