"""Bidirectional self-attention for an encoder, on PyTorch's fused kernel. The padding mask comes as
tokenizers return it: attention_mask (batch, seq_len) with 1 = real token, 0 = padding. SDPA wants a
boolean mask with True = may attend, so it becomes (batch, 1, 1, seq_len) booleans."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0):
        super().__init__()
        assert embed_dim % num_heads == 0
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor, attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        B, L, E = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)                    # 3 x (B, L, E)
        q, k, v = (t.view(B, L, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))

        attn_mask = None
        if attention_mask is not None:
            attn_mask = attention_mask[:, None, None, :].bool()   # (B, 1, 1, L): True = may attend
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                             dropout_p=self.dropout if self.training else 0.0)
        out = out.transpose(1, 2).reshape(B, L, E)
        return self.proj(out)
