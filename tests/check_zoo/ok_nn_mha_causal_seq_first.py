# Correct: nn.MultiheadAttention in its default sequence-first layout, made causal by a registered
# boolean triu buffer passed as attn_mask (True = blocked).
import torch
from torch import nn


class CausalMHABlock(nn.Module):
    def __init__(self, embed_dim, num_heads, max_len):
        super().__init__()
        self.mha = nn.MultiheadAttention(embed_dim, num_heads)
        self.register_buffer("future", torch.triu(torch.ones(max_len, max_len, dtype=torch.bool), diagonal=1))

    def forward(self, src):
        L = src.size(0)
        out, _ = self.mha(src, src, src, attn_mask=self.future[:L, :L])
        return out
