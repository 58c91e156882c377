"""Multi-head self-attention with shape-annotated tensors (jaxtyping-style names in comments) and a
key_padding_mask in PyTorch's convention: (batch, seq) bool, True = padding, never attended."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int, bias: bool = True) -> None:
        super().__init__()
        assert d_model % n_heads == 0
        self.n_heads = n_heads
        self.d_head = d_model // n_heads
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _heads(self, t: Tensor) -> Tensor:
        # Float[Tensor, "batch seq d_model"] -> Float[Tensor, "batch head seq d_head"]
        batch, seq, _ = t.shape
        return t.view(batch, seq, self.n_heads, self.d_head).transpose(1, 2)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        q, k, v = self._heads(self.q_proj(x)), self._heads(self.k_proj(x)), self._heads(self.v_proj(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_head)  # Float[Tensor, "batch head q k"]
        if key_padding_mask is not None:
            scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        attn = F.softmax(scores, dim=-1)
        out = (attn @ v).transpose(1, 2).flatten(2)  # Float[Tensor, "batch seq d_model"]
        return self.out_proj(out)
