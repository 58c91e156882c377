"""A learner's multi-head latent attention (MLA), written from scratch the way the DeepSeek-V2 paper lays
it out: x is pressed into a small latent c (W_DKV), each head's keys and values come back out of it (W_UK,
W_UV), and a decoupled rotary key (W_KR) shared by all heads carries the positions. ``absorb=True`` is the
decoding form: W_UK folded into the query, attention over the latents themselves, W_UV after the sum."""

import math

import torch
from torch import nn


def rope(x, base=10000.0):
    """Turn x (..., T, R) by its positions 0 .. T-1, features paired as neighbours (2i, 2i + 1)."""
    T, R = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / base ** (torch.arange(0, R, 2, dtype=x.dtype) / R)
    angles = torch.arange(T, dtype=x.dtype)[:, None] * inv_freq  # (T, R/2)
    cos, sin = angles.cos(), angles.sin()
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)


class LatentAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_rank=8, nope_dim=8, rope_dim=4):
        super().__init__()
        self.n_heads, self.kv_rank, self.nope_dim, self.rope_dim = n_heads, kv_rank, nope_dim, rope_dim
        self.W_Q = nn.Linear(d_model, n_heads * (nope_dim + rope_dim), bias=False)
        self.W_DKV = nn.Linear(d_model, kv_rank, bias=False)  # the latent: all a decoder has to cache
        self.W_KR = nn.Linear(d_model, rope_dim, bias=False)  # one rotary key for every head
        self.W_UK = nn.Linear(kv_rank, n_heads * nope_dim, bias=False)
        self.W_UV = nn.Linear(kv_rank, n_heads * nope_dim, bias=False)
        self.W_O = nn.Linear(n_heads * nope_dim, d_model, bias=False)

    def forward(self, x, absorb=False):
        B, T, _ = x.shape
        H, C, Dn, R = self.n_heads, self.kv_rank, self.nope_dim, self.rope_dim
        q = self.W_Q(x).view(B, T, H, Dn + R).transpose(1, 2)  # (B, H, T, Dn + R)
        q_nope, q_rope = q.split([Dn, R], dim=-1)
        c = self.W_DKV(x)  # (B, T, C)
        q_rope, k_rope = rope(q_rope), rope(self.W_KR(x)[:, None])  # (B, H, T, R), (B, 1, T, R)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)

        if absorb:  # decoding: never expand the latents into per-head keys and values
            w_uk = self.W_UK.weight.view(H, Dn, C)
            w_uv = self.W_UV.weight.view(H, Dn, C)
            q_latent = torch.einsum("bhtd,hdc->bhtc", q_nope, w_uk)  # q_nope . (W_UK c) = (q_nope W_UK) . c
            scores = q_latent @ c[:, None].transpose(-2, -1) + q_rope @ k_rope.transpose(-2, -1)
            weights = (scores / math.sqrt(Dn + R)).masked_fill(future, float("-inf")).softmax(dim=-1)
            out = torch.einsum("bhtc,hdc->bhtd", weights @ c[:, None], w_uv)  # W_UV after the weighted sum
        else:  # training and prefill: decompress every head's keys and values
            k_nope = self.W_UK(c).view(B, T, H, Dn).transpose(1, 2)
            v = self.W_UV(c).view(B, T, H, Dn).transpose(1, 2)
            k = torch.cat((k_nope, k_rope.expand(B, H, T, R)), dim=-1)
            scores = torch.cat((q_nope, q_rope), dim=-1) @ k.transpose(-2, -1)
            weights = (scores / math.sqrt(Dn + R)).masked_fill(future, float("-inf")).softmax(dim=-1)
            out = weights @ v
        return self.W_O(out.transpose(1, 2).reshape(B, T, H * Dn))
