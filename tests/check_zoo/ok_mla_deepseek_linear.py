# Correct: MLA as DeepSeek-V3's reference inference code writes it: a Linear class of its own (weight
# (out, in), F.linear), RMSNorm through F.rms_norm, low-rank queries (wq_a, q_norm, wq_b), keys and values
# from the normed latent (wkv_a, kv_norm, wkv_b), RoPE on neighbouring pairs as complex numbers, and an
# absorbed form (wkv_b's key rows folded into the query, its value rows after the sum) for decoding.
import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_features, in_features) * in_features ** -0.5)
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return F.rms_norm(x, (self.dim,), self.weight, self.eps)


def precompute_freqs_cis(dim, seqlen, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    freqs = torch.outer(torch.arange(seqlen, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(x, freqs_cis):
    dtype = x.dtype
    x = torch.view_as_complex(x.double().view(*x.shape[:-1], -1, 2))
    freqs_cis = freqs_cis.view(1, x.size(1), 1, x.size(-1))
    return torch.view_as_real(x * freqs_cis).flatten(3).to(dtype)


class MLA(nn.Module):
    def __init__(self, dim, n_heads, q_lora_rank=12, kv_lora_rank=6, qk_nope_head_dim=6, qk_rope_head_dim=4,
                 v_head_dim=5):
        super().__init__()
        self.n_local_heads, self.kv_lora_rank = n_heads, kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = qk_nope_head_dim, qk_rope_head_dim
        self.qk_head_dim, self.v_head_dim = qk_nope_head_dim + qk_rope_head_dim, v_head_dim
        self.wq_a = Linear(dim, q_lora_rank)
        self.q_norm = RMSNorm(q_lora_rank)
        self.wq_b = Linear(q_lora_rank, n_heads * self.qk_head_dim)
        self.wkv_a = Linear(dim, kv_lora_rank + qk_rope_head_dim)
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.wkv_b = Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim))
        self.wo = Linear(n_heads * v_head_dim, dim)
        self.softmax_scale = self.qk_head_dim ** -0.5

    def forward(self, x, absorb=False):
        bsz, seqlen, _ = x.size()
        freqs_cis = precompute_freqs_cis(self.qk_rope_head_dim, seqlen)
        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu_(1)
        q = self.wq_b(self.q_norm(self.wq_a(x)))
        q = q.view(bsz, seqlen, self.n_local_heads, self.qk_head_dim)
        q_nope, q_pe = torch.split(q, [self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = apply_rotary_emb(q_pe, freqs_cis)
        kv = self.wkv_a(x)
        kv, k_pe = torch.split(kv, [self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = apply_rotary_emb(k_pe.unsqueeze(2), freqs_cis)
        if not absorb:
            q = torch.cat([q_nope, q_pe], dim=-1)
            kv = self.wkv_b(self.kv_norm(kv))
            kv = kv.view(bsz, seqlen, self.n_local_heads, self.qk_nope_head_dim + self.v_head_dim)
            k_nope, v = torch.split(kv, [self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            k = torch.cat([k_nope, k_pe.expand(-1, -1, self.n_local_heads, -1)], dim=-1)
            scores = torch.einsum("bshd,bthd->bsht", q, k) * self.softmax_scale
        else:
            wkv_b = self.wkv_b.weight.view(self.n_local_heads, -1, self.kv_lora_rank)
            q_nope = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, :self.qk_nope_head_dim])
            kv = self.kv_norm(kv)
            scores = (torch.einsum("bshc,btc->bsht", q_nope, kv) +
                      torch.einsum("bshr,btr->bsht", q_pe, k_pe.squeeze(2))) * self.softmax_scale
        scores = scores + mask.unsqueeze(1)
        scores = scores.softmax(dim=-1, dtype=torch.float32).type_as(x)
        if not absorb:
            x = torch.einsum("bsht,bthd->bshd", scores, v)
        else:
            x = torch.einsum("bsht,btc->bshc", scores, kv)
            x = torch.einsum("bshc,hdc->bshd", x, wkv_b[:, -self.v_head_dim:])
        return self.wo(x.flatten(2))
