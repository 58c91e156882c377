"""Attention in the style of the modded-nanogpt speedrun: one raw parameter qkvo_w of shape (4, hdim, dim)
holds the query, key, value and output weights, applied with F.linear on its slices (the first three
flattened into one matrix); q and k go through an RMSNorm without a weight (F.rms_norm) before RoPE;
causal attention through scaled_dot_product_attention."""

import torch
import torch.nn.functional as F
from torch import nn


def norm(x):
    return F.rms_norm(x, (x.size(-1),))


class Rotary(nn.Module):
    def __init__(self, dim, max_seq_len, base=10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float32) / dim)
        theta = torch.outer(torch.arange(max_seq_len, dtype=torch.float32), inv_freq)  # (T, dim/2)
        self.register_buffer("cos", theta.cos(), persistent=False)
        self.register_buffer("sin", theta.sin(), persistent=False)

    def forward(self, x_BTHD):
        cos = self.cos[None, :x_BTHD.size(-3), None, :].to(x_BTHD.dtype)
        sin = self.sin[None, :x_BTHD.size(-3), None, :].to(x_BTHD.dtype)
        x1, x2 = x_BTHD.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=3)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, num_heads, max_seq_len, head_dim=None):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or dim // num_heads
        hdim = num_heads * self.head_dim
        bound = (3 ** 0.5) * 0.5 * dim ** -0.5
        self.qkvo_w = nn.Parameter(torch.empty(4, hdim, dim).uniform_(-bound, bound))
        self.rotary = Rotary(self.head_dim, max_seq_len)

    def forward(self, x):
        B, T = x.size(0), x.size(1)
        q, k, v = F.linear(x, self.qkvo_w[:3].flatten(end_dim=1).type_as(x)).view(
            B, T, 3 * self.num_heads, self.head_dim).chunk(3, dim=-2)
        q, k = norm(q), norm(k)  # QK-norm, no weight
        q, k = self.rotary(q), self.rotary(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        y = y.transpose(1, 2).contiguous().view(B, T, self.num_heads * self.head_dim)
        return F.linear(y, self.qkvo_w[3].type_as(y))
