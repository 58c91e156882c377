"""GatedMultiHeadAttention: attention whose output is gated per head feature (Qwen3-Next).

    out = out_proj(attn(x) * sigmoid(gate_proj(x)))        attn(x), gate_proj(x): (B, Lq, H*D)

Each head's D output features are scaled by a learned, input-dependent factor in (0, 1) before the
heads are mixed by out_proj, so a head can switch itself off for a token (no "attention sink" is
needed to say nothing). Everything else, caches and masks included, is MultiHeadAttention's.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.layers.multi_head import MultiHeadAttention


class GatedMultiHeadAttention(MultiHeadAttention):
    """MultiHeadAttention plus gate_proj: Linear(E, H*D), biased like q_proj; takes the same arguments."""

    def __init__(self, embed_dim: int, num_heads: int, **options) -> None:
        super().__init__(embed_dim, num_heads, **options)
        weight = self.q_proj.weight
        self.gate_proj = nn.Linear(embed_dim, self.num_heads * self.head_dim, bias=self.q_proj.bias is not None,
                                   device=weight.device, dtype=weight.dtype)
        nn.init.xavier_uniform_(self.gate_proj.weight)
        if self.gate_proj.bias is not None:
            nn.init.zeros_(self.gate_proj.bias)

    def gate_heads(self, merged: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """merged (B, Lq, H*D) * sigmoid(gate_proj(query)), query (B, Lq, E)."""
        return merged * torch.sigmoid(self.gate_proj(query))  # (B, Lq, H*D)

    def extra_repr(self) -> str:
        return super().extra_repr() + ", gated=True"
