# A learner's self-attention: heads split straight into (B, H, L, D) with reshape (no transpose).
import math

import torch
import torch.nn as nn


class TinyAttn(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.h = n_heads
        self.to_q = nn.Linear(dim, dim)
        self.to_k = nn.Linear(dim, dim)
        self.to_v = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, n, e = x.shape
        d = e // self.h
        q = self.to_q(x).reshape(b, self.h, n, d)
        k = self.to_k(x).reshape(b, self.h, n, d)
        v = self.to_v(x).reshape(b, self.h, n, d)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d)
        att = att.softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, n, e)
        return self.proj(y)
