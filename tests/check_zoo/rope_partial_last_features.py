"""Partial rotary embeddings that turn the last rotary_dim features of each head; checkpoints with partial RoPE
(GPT-NeoX, Phi) turn the first rotary_dim and pass the rest through."""

import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class PartialRotaryAttention(nn.Module):
    def __init__(self, d_model, n_heads, rotary_dim=2):
        super().__init__()
        self.n_heads, self.head_dim, self.rotary_dim = n_heads, d_model // n_heads, rotary_dim
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        inv_freq = 1.0 / 10000 ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
        self.register_buffer("inv_freq", inv_freq)

    def rope(self, x):
        T = x.shape[2]
        freqs = torch.outer(torch.arange(T, device=x.device).float(), self.inv_freq)
        cos, sin = torch.cat((freqs, freqs), -1).cos().to(x.dtype), torch.cat((freqs, freqs), -1).sin().to(x.dtype)
        x_pass, x_rot = x[..., :-self.rotary_dim], x[..., -self.rotary_dim:]
        return torch.cat((x_pass, x_rot * cos + rotate_half(x_rot) * sin), dim=-1)

    def forward(self, x):
        B, T, _ = x.shape
        q, k, v = (proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for proj in (self.q, self.k, self.v))
        q, k = self.rope(q), self.rope(k)
        att = (q @ k.transpose(-1, -2)) * self.head_dim ** -0.5
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.o((att @ v).transpose(1, 2).reshape(B, T, -1))
