# Correct: a decoder layer's attention, causal by a mask built on every call, plus an optional additive
# bias (B, 1, Lq, Lk) from the caller (e.g. -inf on padding), added before the softmax.
import torch
from torch import nn


class DecoderSelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.to_qkv = nn.Linear(dim, dim * 3, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, attn_bias=None):
        B, L, E = x.shape
        q, k, v = self.to_qkv(x).view(B, L, 3, self.heads, E // self.heads).permute(2, 0, 3, 1, 4)  # (B, H, L, D)
        scores = q @ k.transpose(-1, -2) * (E // self.heads) ** -0.5
        future = torch.triu(torch.ones(L, L, dtype=torch.bool, device=x.device), diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))
        if attn_bias is not None:
            scores = scores + attn_bias
        return self.to_out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, E))
