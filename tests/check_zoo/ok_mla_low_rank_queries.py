"""A learner's MLA in the DeepSeek-V3 layout, queries included: the query is low-rank too (wq_a presses x
into a query latent, q_norm normalises it, wq_b gives every head's query), the keys and values come out of
a normed latent (wkv_a, kv_norm, wkv_b), and RoPE turns the rotary parts as complex numbers (neighbouring
features paired). ``absorbed=True`` is the decoding form: wkv_b's key rows folded into the query, its value
rows applied after the weighted sum of latents."""

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x, theta=10000.0):
    """x (B, T, H, R) turned by positions 0 .. T-1, as R/2 complex numbers per head."""
    T, R = x.shape[1], x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, R, 2, dtype=x.dtype) / R)
    angles = torch.outer(torch.arange(T, dtype=x.dtype), freqs)  # (T, R/2)
    turns = torch.polar(torch.ones_like(angles), angles)[None, :, None]  # (1, T, 1, R/2)
    pairs = torch.view_as_complex(x.contiguous().view(*x.shape[:-1], R // 2, 2))
    return torch.view_as_real(pairs * turns).flatten(-2)


class LowRankQueryMLA(nn.Module):
    def __init__(self, dim, n_heads, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
                 v_head_dim=6):
        super().__init__()
        self.n_heads, self.kv_lora_rank = n_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.softmax_scale = self.qk_head_dim ** -0.5
        self.wq_a = nn.Linear(dim, q_lora_rank, bias=False)
        self.q_norm = RMSNorm(q_lora_rank)
        self.wq_b = nn.Linear(q_lora_rank, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)

    def forward(self, x, absorbed=False):
        bsz, seqlen, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))).view(bsz, seqlen, self.n_heads, self.qk_head_dim)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = rotate(q_pe)
        kv, k_pe = self.wkv_a(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = rotate(k_pe.unsqueeze(2))  # (B, T, 1, R): one rotary key for every head
        kv = self.kv_norm(kv)  # (B, T, C): what a decoder caches, with k_pe
        mask = torch.full((seqlen, seqlen), float("-inf")).triu(1)
        if absorbed:
            wkv_b = self.wkv_b.weight.view(self.n_heads, -1, self.kv_lora_rank)  # (H, Dn + Dv, C)
            q_nope = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :self.qk_nope_head_dim])
            scores = torch.einsum("bshc,btc->bsht", q_nope, kv) + torch.einsum("bshr,btr->bsht", q_pe, k_pe[:, :, 0])
            probs = F.softmax(scores * self.softmax_scale + mask[:, None], dim=-1)
            out = torch.einsum("bsht,btc->bshc", probs, kv)
            out = torch.einsum("bshc,hdc->bshd", out, wkv_b[:, -self.v_head_dim:])
        else:
            kv = self.wkv_b(kv).view(bsz, seqlen, self.n_heads, self.qk_nope_head_dim + self.v_head_dim)
            k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1)
            q = torch.cat([q_nope, q_pe], dim=-1)
            scores = torch.einsum("bshd,bthd->bsht", q, k)
            probs = F.softmax(scores * self.softmax_scale + mask[:, None], dim=-1)
            out = torch.einsum("bsht,bthd->bshd", probs, v)
        return self.wo(out.flatten(2))
