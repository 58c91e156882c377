"""Document 000: split the heads by ``reshape`` then ``transpose(1, 2)``.

The document's ``MultiHeadAttention(hidden_size, num_heads)``: self-attention on a batch-first input
``(B, L, hidden_size)`` with four ``nn.Linear(hidden_size, hidden_size)`` layers
``q_linear / k_linear / v_linear / o_linear``. Its question is why ``split_head`` does
``reshape(B, -1, H, d).transpose(1, 2)`` and not ``reshape(B, H, -1, d)``: the hidden features of one
token are stored head after head (头1的特征, 头2的特征), so the reshape must first cut the *last* dim
into ``(H, d)`` for every token, and only then may the transpose bring the heads forward.

Mask convention (注意力掩码): ``attention_mask`` is a 0/1 tensor where **1 = blocked**. It is
multiplied by -1e9 and *added* to the scaled scores, so it must broadcast to ``(B, H, L, L)``:
an ``(L, L)`` causal mask, or ``(B, 1, 1, L)`` for padding. In multihead: ``Mask.block(m)``.
"""

from __future__ import annotations

import torch
from torch import nn

from multihead.textbook._checks import check_broadcasts, check_features, check_heads_divide


class ReshapeTransposeHeads(nn.Module):
    """Multi-head self-attention of document 000. x (B, L, hidden_size) -> (B, L, hidden_size)."""

    def __init__(self, hidden_size: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        # Each head's size; hidden_size must split evenly (二者必须整除).
        self.head_dim = check_heads_divide(hidden_size, num_heads, "hidden_size")

        # Projections that turn each token's vector into its query, key and value, same size.
        self.q_linear = nn.Linear(hidden_size, hidden_size)
        self.k_linear = nn.Linear(hidden_size, hidden_size)
        self.v_linear = nn.Linear(hidden_size, hidden_size)

        # Output projection applied after the heads are concatenated back together.
        self.o_linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_state: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """hidden_state (B, L, hidden_size); attention_mask 0/1, 1 = blocked, broadcast to (B, H, L, L)."""
        check_features(hidden_state, "hidden_state", 3, "(B, L, hidden_size)",
                       self.num_heads * self.head_dim)
        batch_size = hidden_state.size(0)

        # Linear projections, all (B, L, hidden_size).
        query = self.q_linear(hidden_state)
        key = self.k_linear(hidden_state)
        value = self.v_linear(hidden_state)

        # Split into heads: (B, L, hidden_size) -> (B, H, L, head_dim).
        query = self.split_head(query)
        key = self.split_head(key)
        value = self.split_head(value)

        # Scaled dot-product scores (缩放点积): (B, H, L, d) @ (B, H, d, L) -> (B, H, L, L).
        attention_scores = torch.matmul(query, key.transpose(-1, -2)) / torch.sqrt(
            torch.tensor(self.head_dim, dtype=torch.float32)
        )

        # Additive mask: where the mask is 1 the score drops by 1e9, so softmax gives it ~0 weight.
        if attention_mask is not None:
            check_broadcasts(attention_mask, attention_scores.shape, "attention_mask", "(B, H, L, L)")
            attention_scores += attention_mask * -1e9

        # Attention probabilities over the keys (注意力概率), (B, H, L, L).
        attention_probs = torch.softmax(attention_scores, dim=-1)

        # Weighted sum of the values: (B, H, L, L) @ (B, H, L, d) -> (B, H, L, d).
        output = torch.matmul(attention_probs, value)

        # Concatenate the heads (拼接): (B, H, L, d) -> (B, L, H, d) -> (B, L, H * d).
        output = output.transpose(1, 2).reshape(batch_size, -1, self.head_dim * self.num_heads)

        # Output projection, (B, L, hidden_size).
        return self.o_linear(output)

    def split_head(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, hidden_size) -> (B, H, L, head_dim): reshape cuts the features, transpose moves H."""
        batch_size = x.size(0)
        # (B, L, hidden_size) -> (B, L, H, d): each token's features cut into H consecutive pieces.
        # (B, L, H, d) -> (B, H, L, d): every head now sees all tokens of its own feature slice.
        return x.reshape(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)
