# Correct: MLA laid out as DeepSeek-V3's public inference code lays it out. A module-level switch picks the
# attention form ("absorb": every head's key rows of wkv_b folded into its query, scores taken on the cached
# latents plus the rotary part, the value rows applied after the weighted sum), the layer is built from a
# dataclass of model arguments, the caller hands it the start position, the complex rotary table and an
# additive causal mask, and the weights live in a Linear class of the file's own (weight (out, in), F.linear).
from dataclasses import dataclass
from typing import Literal, Optional

import torch
import torch.nn.functional as F
from torch import nn

world_size = 1
attn_impl: Literal["naive", "absorb"] = "absorb"


@dataclass
class ModelArgs:
    max_batch_size: int = 4
    max_seq_len: int = 128
    dim: int = 32
    n_heads: int = 4
    q_lora_rank: int = 0
    kv_lora_rank: int = 8
    qk_nope_head_dim: int = 8
    qk_rope_head_dim: int = 4
    v_head_dim: int = 6
    rope_theta: float = 10000.0


class Linear(nn.Module):
    """The file's own projection: a weight (out, in) applied with F.linear, in a default dtype of its own."""

    dtype = torch.bfloat16

    def __init__(self, in_features, out_features, bias=False, dtype=None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype or Linear.dtype))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class ColumnParallelLinear(Linear):
    """Output features split over the world (one process here)."""

    def __init__(self, in_features, out_features, bias=False, dtype=None):
        assert out_features % world_size == 0
        super().__init__(in_features, out_features // world_size, bias, dtype)


class RowParallelLinear(Linear):
    """Input features split over the world (one process here)."""

    def __init__(self, in_features, out_features, bias=False, dtype=None):
        assert in_features % world_size == 0
        super().__init__(in_features // world_size, out_features, bias, dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (x.size(-1),), self.weight, self.eps)


def precompute_freqs_cis(args):
    """(max_seq_len, R/2) complex numbers of modulus 1: position t, pair i turned by t * theta^(-2i/R)."""
    half = args.qk_rope_head_dim // 2
    inv_freq = args.rope_theta ** (-torch.arange(half, dtype=torch.float32) * 2 / args.qk_rope_head_dim)
    t = torch.arange(args.max_seq_len, dtype=torch.float32)[:, None]
    return torch.exp(1j * (t * inv_freq))


def apply_rotary_emb(x, freqs_cis):
    """x (B, L, H, R) with neighbouring features (2i, 2i+1) as one complex number, turned by freqs_cis (L, R/2)."""
    as_complex = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))  # (B, L, H, R/2)
    turned = as_complex * freqs_cis[None, :, None, :]
    return torch.view_as_real(turned).flatten(-2).to(x.dtype)


class MLA(nn.Module):
    """Multi-head latent attention with a latent cache; `attn_impl` picks the naive or the absorbed form."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.dim, self.n_heads = args.dim, args.n_heads
        self.n_local_heads = args.n_heads // world_size
        self.q_lora_rank, self.kv_lora_rank = args.q_lora_rank, args.kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = args.qk_nope_head_dim, args.qk_rope_head_dim
        self.qk_head_dim = args.qk_nope_head_dim + args.qk_rope_head_dim
        self.v_head_dim = args.v_head_dim
        if self.q_lora_rank:
            self.wq_a = Linear(self.dim, self.q_lora_rank)
            self.q_norm = RMSNorm(self.q_lora_rank)
            self.wq_b = ColumnParallelLinear(self.q_lora_rank, self.n_heads * self.qk_head_dim)
        else:
            self.wq = ColumnParallelLinear(self.dim, self.n_heads * self.qk_head_dim)
        self.wkv_a = Linear(self.dim, self.kv_lora_rank + self.qk_rope_head_dim)
        self.kv_norm = RMSNorm(self.kv_lora_rank)
        per_head = self.qk_nope_head_dim + self.v_head_dim
        self.wkv_b = ColumnParallelLinear(self.kv_lora_rank, self.n_heads * per_head)
        self.wo = RowParallelLinear(self.n_heads * self.v_head_dim, self.dim)
        self.softmax_scale = self.qk_head_dim ** -0.5
        B, T, H = args.max_batch_size, args.max_seq_len, self.n_local_heads
        if attn_impl == "absorb":  # the cache holds what the keys are made from: latents and rotary keys
            self.register_buffer("kv_cache", torch.zeros(B, T, self.kv_lora_rank), persistent=False)
            self.register_buffer("pe_cache", torch.zeros(B, T, self.qk_rope_head_dim), persistent=False)
        else:  # the cache holds every head's full key and value
            self.register_buffer("k_cache", torch.zeros(B, T, H, self.qk_head_dim), persistent=False)
            self.register_buffer("v_cache", torch.zeros(B, T, H, self.v_head_dim), persistent=False)

    def queries(self, x, freqs_cis):
        """(q_nope (B, L, H, Dn), q_pe (B, L, H, R) turned)."""
        B, L, _ = x.shape
        q = self.wq_b(self.q_norm(self.wq_a(x))) if self.q_lora_rank else self.wq(x)
        q_nope, q_pe = q.view(B, L, self.n_local_heads, -1).split([self.qk_nope_head_dim, self.qk_rope_head_dim], -1)
        return q_nope, apply_rotary_emb(q_pe, freqs_cis)

    def forward(self, x: torch.Tensor, start_pos: int, freqs_cis: torch.Tensor, mask: Optional[torch.Tensor]):
        B, L, _ = x.shape
        end = start_pos + L
        q_nope, q_pe = self.queries(x, freqs_cis)
        latent, k_pe = self.wkv_a(x).split([self.kv_lora_rank, self.qk_rope_head_dim], -1)
        k_pe = apply_rotary_emb(k_pe[:, :, None], freqs_cis)  # (B, L, 1, R): one rotary key for every head
        up = self.wkv_b.weight.view(self.n_local_heads, -1, self.kv_lora_rank)  # (H, Dn + Dv, C)
        if attn_impl == "absorb":
            self.kv_cache[:B, start_pos:end] = self.kv_norm(latent)
            self.pe_cache[:B, start_pos:end] = k_pe[:, :, 0]
            latents, rotary = self.kv_cache[:B, :end], self.pe_cache[:B, :end]
            q_latent = torch.einsum("bshd,hdc->bshc", q_nope, up[:, :self.qk_nope_head_dim])
            scores = torch.einsum("bshc,btc->bsht", q_latent, latents) + torch.einsum("bshr,btr->bsht", q_pe, rotary)
        else:
            kv = self.wkv_b(self.kv_norm(latent)).view(B, L, self.n_local_heads, -1)
            k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], -1)
            self.k_cache[:B, start_pos:end] = torch.cat([k_nope, k_pe.expand_as(q_pe)], -1)
            self.v_cache[:B, start_pos:end] = v
            scores = torch.einsum("bshd,bthd->bsht", torch.cat([q_nope, q_pe], -1), self.k_cache[:B, :end])
        scores = scores * self.softmax_scale
        if mask is not None:
            scores = scores + mask[:, None]  # (L, T) broadcast over the heads
        probs = scores.softmax(dim=-1, dtype=torch.float32).type_as(x)
        if attn_impl == "absorb":
            out = torch.einsum("bsht,btc->bshc", probs, self.kv_cache[:B, :end])
            out = torch.einsum("bshc,hdc->bshd", out, up[:, -self.v_head_dim:])
        else:
            out = torch.einsum("bsht,bthd->bshd", probs, self.v_cache[:B, :end])
        return self.wo(out.flatten(2))


def causal_mask(seqlen: int) -> torch.Tensor:
    """What the model passes every layer: -inf above the diagonal (nothing for a single token)."""
    if seqlen == 1:
        return None
    return torch.triu(torch.full((seqlen, seqlen), float("-inf")), diagonal=1)
