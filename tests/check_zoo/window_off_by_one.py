"""A sliding window built with <= where < belongs: with window=4 every token sees 5 keys."""

import math

import torch
from torch import nn


class LocalAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, window=4):
        super().__init__()
        self.num_heads, self.head_dim, self.window = num_heads, embed_dim // num_heads, window
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        pos = torch.arange(T, device=x.device)
        distance = pos[:, None] - pos[None, :]
        blocked = (distance < 0) | (distance > self.window)  # should be distance >= self.window
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = att.masked_fill(blocked, float("-inf")).softmax(dim=-1)
        return self.proj((att @ v).transpose(1, 2).reshape(B, T, C))
