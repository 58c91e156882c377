"""A causal self-attention block in the litgpt habit: a config with n_embd, n_head, n_query_groups and
head_size, one fused qkv Linear cut into [queries | keys | values], rotary on the first rope_n_elem features
of each head only (cos/sin built for that many), and SDPA told about the groups with enable_gqa."""
import math

import torch
import torch.nn.functional as F
from torch import nn


def build_rope_cache(seq_len, n_elem, base=10000):
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2).double() / n_elem))
    idx_theta = torch.outer(torch.arange(seq_len).double(), theta).repeat(1, 2)
    return torch.cos(idx_theta), torch.sin(idx_theta)


def apply_rope(x, cos, sin):
    head_size = x.size(-1)
    x1 = x[..., : head_size // 2]
    x2 = x[..., head_size // 2:]
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x * cos) + (rotated * sin)


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.n_head = config.n_head
        self.n_query_groups = config.n_query_groups
        self.head_size = config.head_size
        self.rope_n_elem = int(config.rotary_percentage * config.head_size)
        shape = (config.n_head + 2 * config.n_query_groups) * config.head_size
        self.qkv = nn.Linear(config.n_embd, shape, bias=config.bias)
        self.proj = nn.Linear(config.head_size * config.n_head, config.n_embd, bias=config.bias)

    def forward(self, x):
        B, T, C = x.size()
        query_size = self.n_head * self.head_size
        key_size = value_size = self.n_query_groups * self.head_size
        q, k, v = self.qkv(x).split((query_size, key_size, value_size), dim=-1)
        q = q.view(B, T, self.n_head, self.head_size).transpose(1, 2)
        k = k.view(B, T, self.n_query_groups, self.head_size).transpose(1, 2)
        v = v.view(B, T, self.n_query_groups, self.head_size).transpose(1, 2)

        cos, sin = build_rope_cache(T, self.rope_n_elem)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        q_roped = apply_rope(q[..., : self.rope_n_elem], cos, sin)
        k_roped = apply_rope(k[..., : self.rope_n_elem], cos, sin)
        q = torch.cat((q_roped, q[..., self.rope_n_elem:]), dim=-1)
        k = torch.cat((k_roped, k[..., self.rope_n_elem:]), dim=-1)

        scale = 1.0 / math.sqrt(self.head_size)
        y = F.scaled_dot_product_attention(q, k, v, scale=scale, is_causal=True, enable_gqa=True)
        y = y.transpose(1, 2).reshape(B, T, self.head_size * self.n_head)
        return self.proj(y)
