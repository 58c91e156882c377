"""RoPE whose cos/sin tables are built for interleaved pairs (each frequency repeated on neighbouring
features, as a GPT-J checkpoint expects) but turned with Llama's rotate_half, which pairs i with i + D/2."""

import math

import torch
from torch import nn


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotarySelfAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads, self.dim_head = heads, dim // heads
        self.to_qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim)
        inv_freq = 1.0 / (10000 ** (torch.arange(0, self.dim_head, 2).float() / self.dim_head))
        self.register_buffer("inv_freq", inv_freq)

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = self.to_qkv(x).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, self.heads, self.dim_head).transpose(1, 2) for t in (q, k, v))
        freqs = torch.outer(torch.arange(n, dtype=self.inv_freq.dtype), self.inv_freq)
        freqs = freqs.repeat_interleave(2, dim=-1)
        q = q * freqs.cos() + rotate_half(q) * freqs.sin()
        k = k * freqs.cos() + rotate_half(k) * freqs.sin()
        attn = (q @ k.transpose(-1, -2) / math.sqrt(self.dim_head)).softmax(dim=-1)
        out = (attn @ v).transpose(1, 2).reshape(b, n, -1)
        return self.to_out(out)
