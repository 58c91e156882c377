"""Grouped-query attention whose key/value heads are copied by tiling: ``expand`` on a new leading axis
puts kv head j on query heads j, j + n_kv, ... instead of on its own group of neighbouring heads."""

import math

import torch
from torch import nn


class SharedKVAttention(nn.Module):
    def __init__(self, d_model, num_heads, num_kv_heads=2):
        super().__init__()
        self.h, self.h_kv, self.d = num_heads, num_kv_heads, d_model // num_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, num_kv_heads * self.d)
        self.v = nn.Linear(d_model, num_kv_heads * self.d)
        self.o = nn.Linear(d_model, d_model)

    def forward(self, x, key_padding_mask=None):
        B, L, _ = x.shape
        q = self.q(x).view(B, L, self.h, self.d).transpose(1, 2)
        k, v = (proj(x).view(B, L, self.h_kv, self.d).transpose(1, 2) for proj in (self.k, self.v))
        group = self.h // self.h_kv
        k = k[:, None].expand(B, group, self.h_kv, L, self.d).reshape(B, self.h, L, self.d)
        v = v[:, None].expand(B, group, self.h_kv, L, self.d).reshape(B, self.h, L, self.d)
        s = q @ k.transpose(-1, -2) / math.sqrt(self.d)
        if key_padding_mask is not None:
            s = s.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        y = s.softmax(-1) @ v
        return self.o(y.transpose(1, 2).reshape(B, L, -1))
