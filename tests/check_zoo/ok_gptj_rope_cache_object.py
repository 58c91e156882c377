"""A learner's GPT-J-style decoder attention: RoPE on interleaved pairs (rotate_every_two with
repeat_interleave'd sin/cos), and a cache object from ``new_cache(batch, max_len)`` that ``forward``
fills in place, keeping how many tokens it holds."""

import math

import torch
from torch import nn


def rotate_every_two(x):
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class KVBuffer:
    def __init__(self, batch, max_len, heads, head_dim, dtype):
        self.k = torch.zeros(batch, heads, max_len, head_dim, dtype=dtype)
        self.v = torch.zeros(batch, heads, max_len, head_dim, dtype=dtype)
        self.length = 0


class GPTJAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, base=10000):
        super().__init__()
        self.num_heads, self.head_dim, self.base = num_heads, embed_dim // num_heads, base
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def new_cache(self, batch, max_len):
        return KVBuffer(batch, max_len, self.num_heads, self.head_dim, self.q_proj.weight.dtype)

    def rotary(self, x, offset):
        inv_freq = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=x.dtype) / self.head_dim))
        t = torch.arange(offset, offset + x.shape[2], dtype=x.dtype)
        sinusoid = torch.einsum("i,j->ij", t, inv_freq)
        sin = sinusoid.sin().repeat_interleave(2, dim=-1)
        cos = sinusoid.cos().repeat_interleave(2, dim=-1)
        return x * cos + rotate_every_two(x) * sin

    def split(self, t):
        B, L, _ = t.shape
        return t.view(B, L, self.num_heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, hidden_states, cache=None):
        B, L, E = hidden_states.shape
        q, k, v = (self.split(p(hidden_states)) for p in (self.q_proj, self.k_proj, self.v_proj))
        past = 0 if cache is None else cache.length
        q, k = self.rotary(q, past), self.rotary(k, past)
        if cache is not None:
            cache.k[:, :, past:past + L] = k
            cache.v[:, :, past:past + L] = v
            cache.length = past + L
            k, v = cache.k[:, :, :past + L], cache.v[:, :, :past + L]
        S = k.shape[2]
        w = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        future = torch.triu(torch.ones(L, S, dtype=torch.bool), diagonal=S - L + 1)
        w = w.masked_fill(future, torch.finfo(w.dtype).min)
        out = torch.matmul(torch.softmax(w, dim=-1), v)
        return self.out_proj(out.permute(0, 2, 1, 3).reshape(B, L, E))
