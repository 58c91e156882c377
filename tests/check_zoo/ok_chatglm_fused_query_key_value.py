"""ChatGLM2/3-style self-attention, as Chinese tutorials copy it (THUDM/ChatGLM2-6B modeling_chatglm.py):
sequence first (L, B, E); one fused ``query_key_value`` layer for the query heads and a few multi-query key/value
groups; rotary on the first half of each head, in interleaved pairs; an optional bool mask whose True = blocked
(without one, causal)."""

import math

import torch
from torch import nn


def apply_rotary(x, rope_cache):
    # x: (L, B, H, D); rope_cache: (L, rot/2, 2) cos, sin; only the first rot features turn, in pairs (2i, 2i+1)
    rot = rope_cache.shape[-2] * 2
    x, x_pass = x[..., :rot], x[..., rot:]
    xs = x.reshape(*x.shape[:-1], rot // 2, 2)
    cache = rope_cache[:, None, None]
    out = torch.stack([xs[..., 0] * cache[..., 0] - xs[..., 1] * cache[..., 1],
                       xs[..., 1] * cache[..., 0] + xs[..., 0] * cache[..., 1]], dim=-1)
    return torch.cat((out.flatten(3), x_pass), dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, multi_query_group_num=2):
        super().__init__()
        self.np, self.g = num_attention_heads, multi_query_group_num
        self.hn = hidden_size // num_attention_heads
        self.query_key_value = nn.Linear(hidden_size, self.np * self.hn + 2 * self.g * self.hn, bias=True)
        self.dense = nn.Linear(self.np * self.hn, hidden_size, bias=False)

    def rope(self, seq_len, dtype):
        rot = self.hn // 2
        theta = 1.0 / (10000 ** (torch.arange(0, rot, 2, dtype=torch.float) / rot))
        idx_theta = torch.outer(torch.arange(seq_len, dtype=torch.float), theta)
        return torch.stack([torch.cos(idx_theta), torch.sin(idx_theta)], dim=-1).to(dtype)

    def forward(self, hidden_states, attention_mask=None):
        sq, b, _ = hidden_states.shape
        mixed = self.query_key_value(hidden_states)
        q, k, v = mixed.split([self.np * self.hn, self.g * self.hn, self.g * self.hn], dim=-1)
        q = q.view(sq, b, self.np, self.hn)
        k = k.view(sq, b, self.g, self.hn)
        v = v.view(sq, b, self.g, self.hn)
        cache = self.rope(sq, q.dtype)
        q, k = apply_rotary(q, cache), apply_rotary(k, cache)
        k = k.unsqueeze(-2).expand(-1, -1, -1, self.np // self.g, -1).reshape(sq, b, self.np, self.hn)
        v = v.unsqueeze(-2).expand(-1, -1, -1, self.np // self.g, -1).reshape(sq, b, self.np, self.hn)
        q, k, v = (t.permute(1, 2, 0, 3) for t in (q, k, v))  # (b, np, sq, hn)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.hn)
        if attention_mask is None:
            attention_mask = torch.ones(sq, sq, dtype=torch.bool, device=scores.device).triu(1)
        scores = scores.masked_fill(attention_mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ctx = torch.matmul(probs, v)  # (b, np, sq, hn)
        ctx = ctx.permute(2, 0, 1, 3).reshape(sq, b, self.np * self.hn)
        return self.dense(ctx)
