"""Multi-head latent attention (MLA) in the layout of DeepSeek-V3's reference inference code: a home-made
Linear calling F.linear, low-rank queries (wq_a -> q_norm -> wq_b), keys and values from a normalised
latent (wkv_a -> kv_norm -> wkv_b), and decoupled RoPE on a few extra features per head, turned as
complex numbers (neighbouring features paired). Naive form, causal."""
import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


def precompute_freqs_cis(rope_dim: int, seqlen: int, theta: float = 10000.0) -> torch.Tensor:
    """(seqlen, rope_dim // 2) unit complex numbers e^(i * pos * freq)."""
    freqs = 1.0 / (theta ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
    angles = torch.outer(torch.arange(seqlen, dtype=torch.float64), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """x (bsz, seqlen, heads, rope_dim): features (0, 1), (2, 3), ... turned as complex numbers."""
    dtype = x.dtype
    x = torch.view_as_complex(x.to(torch.float64).reshape(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, x.size(1), 1, x.size(-1))
    return torch.view_as_real(x * freqs_cis).flatten(3).to(dtype)


class MLA(nn.Module):
    def __init__(self, dim: int, n_heads: int, q_lora_rank: int, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, rope_theta: float = 10000.0):
        super().__init__()
        self.n_heads = n_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.rope_theta = rope_theta
        self.wq_a = Linear(dim, q_lora_rank)
        self.q_norm = RMSNorm(q_lora_rank)
        self.wq_b = Linear(q_lora_rank, n_heads * self.qk_head_dim)
        self.wkv_a = Linear(dim, kv_lora_rank + qk_rope_head_dim)
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.wkv_b = Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim))
        self.wo = Linear(n_heads * v_head_dim, dim)
        self.softmax_scale = self.qk_head_dim ** -0.5

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        bsz, seqlen, _ = x.size()
        freqs_cis = precompute_freqs_cis(self.qk_rope_head_dim, seqlen, self.rope_theta)
        if mask is None:
            mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu_(1)

        q = self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bsz, seqlen, self.n_heads, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = apply_rotary_emb(q_pe, freqs_cis)

        kv = self.wkv_a(x)
        kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)  # one rotary key shared by every head

        q = torch.cat([q_nope, q_pe], dim=-1)
        kv = self.wkv_b(self.kv_norm(kv))
        kv = kv.view(bsz, seqlen, self.n_heads, self.qk_nope_head_dim + self.v_head_dim)
        k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
        k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_heads, -1)], dim=-1)

        scores = torch.einsum("bshd,bthd->bsht", q, k) * self.softmax_scale
        scores = scores + mask.unsqueeze(1)
        scores = scores.softmax(dim=-1)
        x = torch.einsum("bsht,bthd->bshd", scores, v)
        return self.wo(x.flatten(2))
