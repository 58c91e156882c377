"""A learner's MLA with DeepSeek's weight names: one kv_a_proj_with_mqa gives the latent (then normed by
kv_a_layernorm) and the shared rotary key, one kv_b_proj holds every head's [W_UK | W_UV] rows. Its absorbed path (``forward_absorbed``)
multiplies the query by W_UK transposed, reading kv_b_proj.weight as (out, in) = "x @ W.T": it runs only
because qk_nope_head_dim == kv_lora_rank here, and attends with the wrong queries."""

import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class CompressedKVAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, kv_lora_rank=6, qk_nope_head_dim=6, qk_rope_head_dim=4,
                 v_head_dim=4, rope_theta=10000.0):
        super().__init__()
        self.num_heads, self.kv_lora_rank = num_heads, kv_lora_rank
        self.nope, self.rope, self.v_dim = qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.softmax_scale = (qk_nope_head_dim + qk_rope_head_dim) ** -0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * (qk_nope_head_dim + qk_rope_head_dim), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(hidden_size, kv_lora_rank + qk_rope_head_dim, bias=False)
        self.kv_a_layernorm = nn.RMSNorm(kv_lora_rank, eps=1e-6)
        self.kv_b_proj = nn.Linear(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim), bias=False)
        self.o_proj = nn.Linear(num_heads * v_head_dim, hidden_size, bias=False)
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, qk_rope_head_dim, 2).float() / qk_rope_head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def _project(self, x):
        bsz, seq, _ = x.shape
        q = self.q_proj(x).view(bsz, seq, self.num_heads, -1).transpose(1, 2)
        q_nope, q_pe = torch.split(q, [self.nope, self.rope], dim=-1)
        compressed_kv, k_pe = torch.split(self.kv_a_proj_with_mqa(x), [self.kv_lora_rank, self.rope], dim=-1)
        compressed_kv = self.kv_a_layernorm(compressed_kv)
        freqs = torch.arange(seq, dtype=self.inv_freq.dtype)[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        q_pe = q_pe * cos + rotate_half(q_pe) * sin
        k_pe = k_pe.unsqueeze(1)
        k_pe = k_pe * cos + rotate_half(k_pe) * sin
        causal = torch.full((seq, seq), float("-inf")).triu(1)
        return q_nope, q_pe, compressed_kv, k_pe, causal

    def forward(self, x):
        bsz, seq, _ = x.shape
        q_nope, q_pe, compressed_kv, k_pe, causal = self._project(x)
        kv = self.kv_b_proj(compressed_kv).view(bsz, seq, self.num_heads, self.nope + self.v_dim).transpose(1, 2)
        k_nope, value_states = torch.split(kv, [self.nope, self.v_dim], dim=-1)
        query_states = torch.cat([q_nope, q_pe], dim=-1)
        key_states = torch.cat([k_nope, k_pe.expand(-1, self.num_heads, -1, -1)], dim=-1)
        attn = (query_states @ key_states.transpose(2, 3) * self.softmax_scale + causal).softmax(dim=-1)
        out = (attn @ value_states).transpose(1, 2).reshape(bsz, seq, -1)
        return self.o_proj(out)

    def forward_absorbed(self, x):
        bsz, seq, _ = x.shape
        q_nope, q_pe, compressed_kv, k_pe, causal = self._project(x)
        wkv_b = self.kv_b_proj.weight.view(self.num_heads, self.nope + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = wkv_b[:, :self.nope], wkv_b[:, self.nope:]
        q_absorbed = q_nope @ w_uk.transpose(1, 2)
        latent = compressed_kv.unsqueeze(1)
        scores = q_absorbed @ latent.transpose(2, 3) + q_pe @ k_pe.transpose(2, 3)
        attn = (scores * self.softmax_scale + causal).softmax(dim=-1)
        out = (attn @ latent) @ w_uv.transpose(1, 2)
        return self.o_proj(out.transpose(1, 2).reshape(bsz, seq, -1))
