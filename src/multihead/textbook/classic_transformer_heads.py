"""Document 002: the classic "Transformer from scratch" multi-head attention.

``MultiHeadAttention(d_model, num_heads)`` with four ``nn.Linear(d_model, d_model)`` layers
``W_q / W_k / W_v / W_o``, and separate inputs ``forward(Q, K, V, mask=None)``: queries may come from
one sequence and keys/values from another (cross-attention), all batch-first ``(B, L, d_model)``.
``split_heads`` is ``view`` + ``transpose(1, 2)``; ``combine_heads`` undoes it with
``transpose(1, 2).contiguous().view(...)``.

Mask convention (掩码): a **keep mask**: positions where ``mask == 0`` are filled with -1e9 before
the softmax, anything nonzero may be attended. It must broadcast to the scores ``(B, H, Lq, Lk)``:
e.g. ``(B, 1, 1, Lk)`` for padding or ``(1, 1, Lq, Lk)`` for causal. In multihead: ``Mask.keep(m)``.

The learner's own code named the method ``farward``; ``nn.Module`` only ever calls ``forward``, so that
module cannot be called. This class spells it ``forward``.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from multihead.textbook._checks import (check_broadcasts, check_features, check_heads_divide,
                                        check_same_dims)


class ClassicTransformerHeads(nn.Module):
    """Document 002's attention. Q (B, Lq, d_model), K, V (B, Lk, d_model) -> (B, Lq, d_model)."""

    def __init__(self, d_model: int, num_heads: int):
        super().__init__()
        self.d_k = check_heads_divide(d_model, num_heads, "d_model")  # each head's size
        self.d_model = d_model
        self.num_heads = num_heads

        # d_model -> d_model: the output is later cut into num_heads pieces of d_k.
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def scaled_dot_product_attention(self, Q, K, V, mask=None):
        """Q (B, H, Lq, d_k), K, V (B, H, Lk, d_k); mask == 0 blocked -> (B, H, Lq, d_k)."""
        # K^T swaps its last two dims: (B, H, Lk, d_k) -> (B, H, d_k, Lk); scores (B, H, Lq, Lk).
        attn_scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            # exp(-1e9) is 0 after the softmax: blocked positions get no weight.
            attn_scores = attn_scores.masked_fill(mask == 0, -1e9)
        attn_probs = torch.softmax(attn_scores, dim=-1)  # (B, H, Lq, Lk)
        return torch.matmul(attn_probs, V)  # (B, H, Lq, d_k)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, d_model) -> (B, H, L, d_k)."""
        batch_size, seq_length, d_model = x.size()  # tuple unpacking of the shape
        # (B, L, d_model) -> (B, L, H, d_k) -> (B, H, L, d_k)
        return x.view(batch_size, seq_length, self.num_heads, self.d_k).transpose(1, 2)

    def combine_heads(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, L, d_k) -> (B, L, d_model)."""
        batch_size, _, seq_length, d_k = x.size()  # _ : the head count is not needed
        # (B, H, L, d_k) -> (B, L, H, d_k), made contiguous, then (H, d_k) merged -> d_model
        return x.transpose(1, 2).contiguous().view(batch_size, seq_length, self.d_model)

    def forward(self, Q: torch.Tensor, K: torch.Tensor, V: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """Q (B, Lq, d_model), K, V (B, Lk, d_model); mask == 0 blocked, broadcast to (B, H, Lq, Lk)."""
        for name, t in (("Q", Q), ("K", K), ("V", V)):
            check_features(t, name, 3, "(B, L, d_model)", self.d_model)
        check_same_dims(Q, "Q", K, "K", (0,), "batch size")
        check_same_dims(K, "K", V, "V", (0, 1), "batch size and length")
        if mask is not None:
            scores_shape = (Q.shape[0], self.num_heads, Q.shape[1], K.shape[1])
            check_broadcasts(mask, scores_shape, "mask", "(B, H, Lq, Lk)")

        Q = self.split_heads(self.W_q(Q))  # (B, H, Lq, d_k)
        K = self.split_heads(self.W_k(K))  # (B, H, Lk, d_k)
        V = self.split_heads(self.W_v(V))  # (B, H, Lk, d_k)

        attn_output = self.scaled_dot_product_attention(Q, K, V, mask)  # (B, H, Lq, d_k)
        return self.W_o(self.combine_heads(attn_output))  # (B, Lq, d_model)
