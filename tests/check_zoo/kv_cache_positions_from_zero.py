"""A decoder that keeps its own KV cache (``reset_cache()``, ``forward(x, use_cache=True)``) and turns
each call's tokens with RoPE from position 0: after the prompt, every new token is rotated as if it were
the first one."""

import math

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class StatefulRoPEAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.reset_cache()

    def reset_cache(self):
        self.k_cache = self.v_cache = None

    def rope(self, x):
        T = x.shape[2]
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.head_dim, 2, dtype=x.dtype) / self.head_dim))
        freqs = torch.outer(torch.arange(T, dtype=x.dtype), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return x * emb.cos() + rotate_half(x) * emb.sin()

    def forward(self, x, use_cache=False):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = self.rope(q), self.rope(k)
        if use_cache:
            if self.k_cache is not None:
                k = torch.cat((self.k_cache, k), dim=2)
                v = torch.cat((self.v_cache, v), dim=2)
            self.k_cache, self.v_cache = k, v
        S = k.shape[2]
        mask = torch.ones(T, S, dtype=torch.bool).tril(S - T)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))
