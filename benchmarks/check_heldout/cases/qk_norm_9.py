"""Speedrun-style causal attention: one raw parameter qkvo_w of shape (4, hdim, dim) holds the query, key,
value and output weights and is applied with F.linear on slices of it; q and k get a parameter-free
RMSNorm before a standard rotate_half RoPE; the fused attention kernel does the rest."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),), eps=1e-6)


class Rotary(nn.Module):
    def __init__(self, dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        inv_freq = base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        theta = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)  # (T, dim/2)
        self.register_buffer("cos", theta.cos(), persistent=False)
        self.register_buffer("sin", theta.sin(), persistent=False)

    def forward(self, x_BTHD: torch.Tensor) -> torch.Tensor:
        T = x_BTHD.size(-3)
        cos = self.cos[None, :T, None, :].to(x_BTHD.dtype)
        sin = self.sin[None, :T, None, :].to(x_BTHD.dtype)
        x1, x2 = x_BTHD.chunk(2, dim=-1)
        y1 = x1 * cos - x2 * sin
        y2 = x2 * cos + x1 * sin
        return torch.cat((y1, y2), dim=-1)


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, num_heads: int, max_seq_len: int = 1024, head_dim: int | None = None):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim or dim // num_heads
        hdim = num_heads * self.head_dim
        assert hdim == dim, "the output slice is used as a (dim, hdim) weight"
        std = 0.5 * (dim ** -0.5)
        bound = (3 ** 0.5) * std  # same standard deviation as a normal init, uniform is faster
        self.qkvo_w = nn.Parameter(torch.empty(4, hdim, dim).uniform_(-bound, bound))
        self.rotary = Rotary(self.head_dim, max_seq_len)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T = x.size(0), x.size(1)
        qkv = F.linear(x, self.qkvo_w[:3].flatten(end_dim=1))  # (B, T, 3 * hdim)
        q, k, v = qkv.view(B, T, 3 * self.num_heads, self.head_dim).chunk(3, dim=-2)
        q, k = norm(q), norm(k)  # QK norm, before the rotation
        q, k = self.rotary(q), self.rotary(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, H, T, D)
        att = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5
        future = torch.triu(torch.ones(T, T, dtype=torch.bool, device=x.device), diagonal=1)
        att = att.masked_fill(future, float("-inf")).softmax(dim=-1)
        y = att @ v
        y = y.transpose(1, 2).view(B, T, self.num_heads * self.head_dim)
        return F.linear(y, self.qkvo_w[3])
