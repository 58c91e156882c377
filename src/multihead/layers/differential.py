"""DifferentialAttention: the difference of two softmax maps cancels common-mode noise (DiffLlama).

The H query heads form H/2 pairs: head i and head i + H/2. Each pair reads the same values, twice as
wide: the value heads are split into two halves that are laid side by side, (B, Hkv/2, Lk, 2D), and
repeated so that every kv head group sees them. With A_i the softmax map of query head i,

    out_i = (1 - λ_init) · RMSNorm( A_i V - λ · A_(i+H/2) V )          (B, Lq, 2D) for pair i
    λ     = exp(λ_q1 · λ_k1) - exp(λ_q2 · λ_k2) + λ_init                  four learned (D,) vectors

and the H/2 pairs of width 2D are merged into H·D features for out_proj, as the heads would be.
Subtracting a second map removes the attention both heads give to irrelevant tokens; the norm (no
weight) and the fixed (1 - λ_init) keep the output's scale. λ_init = 0.8 - 0.6 exp(-0.3 · layer).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from multihead.errors import AttentionError
from multihead.masks import Mask
from multihead.layers.multi_head import MultiHeadAttention


def lambda_init_for_layer(layer_index: int) -> float:
    """The paper's depth schedule for λ_init: 0.8 - 0.6 exp(-0.3 · layer_index)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer_index)


class DifferentialAttention(MultiHeadAttention):
    """MultiHeadAttention whose heads attend in differential pairs; see the module docstring.

    lambda_init: λ_init (see lambda_init_for_layer); norm_eps: the per-pair RMSNorm's epsilon. The
    other arguments are MultiHeadAttention's; num_heads and num_kv_heads must be even, dropout 0.
    """

    def __init__(self, embed_dim: int, num_heads: int, *, lambda_init: float, norm_eps: float = 1e-5,
                 **options) -> None:
        super().__init__(embed_dim, num_heads, **options)
        if self.num_heads % 2 or self.num_kv_heads % 2:
            raise AttentionError(f"differential attention pairs heads and halves the value heads: num_heads and "
                                 f"num_kv_heads must be even; got {self.num_heads} and {self.num_kv_heads}.")
        if self.dropout:
            raise AttentionError(f"differential attention defines no dropout on its two maps; got dropout={self.dropout}.")
        if isinstance(lambda_init, bool) or not isinstance(lambda_init, (int, float)) or not math.isfinite(lambda_init):
            raise AttentionError(f"lambda_init must be a finite number; got {lambda_init!r}.")
        self.lambda_init = float(lambda_init)
        factory = {"device": self.q_proj.weight.device, "dtype": self.q_proj.weight.dtype}
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(self.head_dim, **factory).normal_(0, 0.1)))
        self.pair_norm = nn.RMSNorm(2 * self.head_dim, eps=norm_eps, elementwise_affine=False, **factory)

    def lambda_full(self, dtype: torch.dtype) -> torch.Tensor:
        """λ as a 0-dim tensor: the two exponentials in float32, then `dtype`."""
        first = torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dtype=torch.float32)).to(dtype)
        second = torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dtype=torch.float32)).to(dtype)
        return first - second + self.lambda_init

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None, causal: bool) -> torch.Tensor:
        """q (B, H, Lq, D), k and v (B, Hkv, Lk, D) -> (B, H/2, Lq, 2D): one output per head pair."""
        halves = torch.cat(v.chunk(2, dim=1), dim=-1)  # (B, Hkv/2, Lk, 2D): value halves side by side
        wide_values = halves.repeat(1, 2, 1, 1)  # (B, Hkv, Lk, 2D): kv head j reads halves j mod Hkv/2
        out = super().attend(q, k, wide_values, mask, causal)  # (B, H, Lq, 2D)
        first, second = out.chunk(2, dim=1)  # heads [0, H/2) and [H/2, H): (B, H/2, Lq, 2D) each
        differential = first - self.lambda_full(q.dtype) * second  # (B, H/2, Lq, 2D)
        return (1 - self.lambda_init) * self.pair_norm(differential)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", differential=True, lambda_init={self.lambda_init:.4g}"
