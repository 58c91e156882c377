"""Mistral-style sliding-window attention: a causal decoder whose every token sees only the last
``window_size`` tokens (itself included), built as one boolean mask."""

import math

import torch
from torch import nn


class SlidingWindowAttention(nn.Module):
    def __init__(self, dim, n_heads, window_size=4):
        super().__init__()
        self.n_heads, self.head_dim, self.window_size = n_heads, dim // n_heads, window_size
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim).transpose(1, 2)
        i = torch.arange(seqlen, device=x.device)[:, None]
        j = torch.arange(seqlen, device=x.device)[None, :]
        allowed = (j <= i) & (i - j < self.window_size)  # causal, and within the window
        scores = xq @ xk.transpose(2, 3) / math.sqrt(self.head_dim)
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).type_as(xq) @ xv
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))
