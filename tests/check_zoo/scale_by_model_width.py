# The scores divided by d_model itself (not a square root, not the head size): a scale no rule names.
import torch
from torch import nn


class WidthScaledAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.d_model, self.n_heads = d_model, n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x, attn_mask=None):
        B, L, E = x.shape
        q, k, v = self.qkv(x).reshape(B, L, 3, self.n_heads, E // self.n_heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / self.d_model
        if attn_mask is not None:
            scores = scores.masked_fill(attn_mask[:, None, None, :] == 0, float("-inf"))
        out = scores.softmax(-1) @ v
        return self.proj(out.transpose(1, 2).reshape(B, L, E))
