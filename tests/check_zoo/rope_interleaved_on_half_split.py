"""RoPE whose cos/sin tables are half-split (cat((freqs, freqs)), as Llama builds them) but turned pair by
pair on neighbouring features, as GPT-J's rotate_every_two does."""

import math

import torch
from torch import nn


class PairwiseRotaryAttention(nn.Module):
    def __init__(self, d_model, n_heads, theta=10000.0):
        super().__init__()
        self.n_heads, self.d_head, self.theta = n_heads, d_model // n_heads, theta
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def rotate(self, x):
        n = x.shape[2]
        inv = 1.0 / self.theta ** (torch.arange(0, self.d_head, 2, dtype=x.dtype) / self.d_head)
        angles = torch.arange(n, dtype=x.dtype)[:, None] * inv
        cos = torch.cat((angles.cos(), angles.cos()), dim=-1)
        sin = torch.cat((angles.sin(), angles.sin()), dim=-1)
        turned = torch.stack((-x[..., 1::2], x[..., 0::2]), dim=-1).flatten(-2)
        return x * cos + turned * sin

    def forward(self, x):
        B, L, D = x.shape
        q, k, v = (w(x).view(B, L, self.n_heads, self.d_head).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        q, k = self.rotate(q), self.rotate(k)
        scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(self.d_head)
        out = torch.einsum("bhij,bhjd->bhid", scores.softmax(dim=-1), v)
        return self.wo(out.transpose(1, 2).reshape(B, L, D))
