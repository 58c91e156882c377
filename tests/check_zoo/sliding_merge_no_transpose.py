"""A sliding-window layer (Mistral-style window of 3 keys) that merges the heads with a bare reshape of
(B, H, L, D) into (B, L, H*D), without moving the heads next to the features first."""

import math

import torch
from torch import nn


class WindowedAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, sliding_window=3):
        super().__init__()
        self.h, self.dh, self.window = num_heads, embed_dim // num_heads, sliding_window
        self.wq = nn.Linear(embed_dim, embed_dim)
        self.wk = nn.Linear(embed_dim, embed_dim)
        self.wv = nn.Linear(embed_dim, embed_dim)
        self.wo = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        B, L, E = x.shape
        q, k, v = (w(x).view(B, L, self.h, self.dh).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dh)
        i = torch.arange(L)
        allowed = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < self.window)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v  # (B, H, L, D)
        return self.wo(out.reshape(B, L, E))
