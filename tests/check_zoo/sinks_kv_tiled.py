"""gpt-oss-style attention with sinks and grouped key/value heads, where the kv heads are copied with
``repeat`` (tiling: kv head j lands on query heads j, j + n_kv, ...) instead of ``repeat_interleave``."""

import torch
from torch import nn


class SinkGQAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads=2):
        super().__init__()
        self.n_heads, self.n_kv = num_attention_heads, num_key_value_heads
        self.head_dim = hidden_size // num_attention_heads
        self.q_proj = nn.Linear(hidden_size, num_attention_heads * self.head_dim)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim)
        self.o_proj = nn.Linear(num_attention_heads * self.head_dim, hidden_size)
        self.sinks = nn.Parameter(torch.zeros(num_attention_heads))

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        k = k.repeat(1, self.n_heads // self.n_kv, 1, 1)
        v = v.repeat(1, self.n_heads // self.n_kv, 1, 1)
        scores = q @ k.transpose(-1, -2) * self.head_dim ** -0.5
        scores = scores.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf"))
        sink = self.sinks.view(1, -1, 1, 1).expand(b, -1, t, 1)
        probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        return self.o_proj((probs @ v).transpose(1, 2).reshape(b, t, -1))
