"""Encoder attention whose padding mask is a required argument (there is no None branch): a caller
always passes one, 1 = a real token, 0 = padding, shaped (B, L)."""

import math

import torch
from torch import nn


class PaddedEncoderAttention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def forward(self, x, attention_mask):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-1, -2) / math.sqrt(c // self.n_heads)
        scores = scores.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))
        y = scores.softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(b, t, c))
