"""MLA for decoding: the absorbed form. Keys and values are never expanded per head: the query's no-RoPE
part is folded through each head's slice of wkv_b into the latent space, scores are taken against the
normalised latent itself, and each head's value slice of wkv_b is applied after the weighted sum.
`attn_impl="naive"` expands them instead (the two give the same outputs). RoPE pairs feature i with
i + d/2 (rotate_half). Causal."""
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_cos_sin(rope_dim, seqlen, base, dtype):
    inv_freq = 1.0 / (base ** (torch.arange(0, rope_dim, 2, dtype=torch.float64) / rope_dim))
    freqs = torch.outer(torch.arange(seqlen, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)  # (seqlen, rope_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


class MLA(nn.Module):
    def __init__(self, dim, n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 rope_theta=10000.0, attn_impl="absorb"):
        super().__init__()
        self.n_heads = n_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_theta = rope_theta
        self.attn_impl = attn_impl
        self.wq = nn.Linear(dim, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)
        self.softmax_scale = self.qk_head_dim ** -0.5

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        cos, sin = rope_cos_sin(self.qk_rope_head_dim, seqlen, self.rope_theta, x.dtype)
        cos, sin = cos[None, :, None, :], sin[None, :, None, :]  # (1, seqlen, 1, rope_dim)

        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.qk_head_dim)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = q_pe * cos + rotate_half(q_pe) * sin

        kv, k_pe = self.wkv_a(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = k_pe.unsqueeze(2)
        k_pe = (k_pe * cos + rotate_half(k_pe) * sin).squeeze(2)  # (bsz, seqlen, rope_dim)
        kv = self.kv_norm(kv)  # (bsz, seqlen, kv_lora_rank): this and k_pe are all a decoder caches

        causal = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu(1)
        wkv_b = self.wkv_b.weight.view(self.n_heads, -1, self.kv_lora_rank)  # (heads, nope + v, rank)
        if self.attn_impl == "naive":
            kv_full = torch.einsum("btc,hdc->bthd", kv, wkv_b)
            k_nope, v = kv_full.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            scores = (torch.einsum("bshd,bthd->bsht", q_nope, k_nope)
                      + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) * self.softmax_scale
            probs = F.softmax(scores + causal[:, None, :], dim=-1)
            out = torch.einsum("bsht,bthd->bshd", probs, v)
        else:
            q_latent = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, : self.qk_nope_head_dim])
            scores = (torch.einsum("bshc,btc->bsht", q_latent, kv)
                      + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) * self.softmax_scale
            probs = F.softmax(scores + causal[:, None, :], dim=-1)
            out = torch.einsum("bsht,btc->bshc", probs, kv)
            out = torch.einsum("bshc,hdc->bshd", out, wkv_b[:, -self.v_head_dim:])
        return self.wo(out.flatten(2))
