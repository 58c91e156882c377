"""Qwen3-Next-style gated attention (QwenLM/Qwen3-Next, transformers' modeling_qwen3_next): q_proj is twice as wide
and gives each head its queries and a gate; the attention output is multiplied by sigmoid(gate) before o_proj."""

import torch
import torch.nn.functional as F
from torch import nn


class GatedAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads=2):
        super().__init__()
        self.head_dim = hidden_size // num_attention_heads
        self.n_heads, self.n_kv = num_attention_heads, num_key_value_heads
        self.q_proj = nn.Linear(hidden_size, num_attention_heads * self.head_dim * 2, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(num_attention_heads * self.head_dim, hidden_size, bias=False)

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        q, gate = torch.chunk(self.q_proj(hidden_states).view(b, t, -1, self.head_dim * 2), 2, dim=-1)
        gate = gate.reshape(b, t, -1)
        q = q.transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        v = v.repeat_interleave(self.n_heads // self.n_kv, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out = out.transpose(1, 2).reshape(b, t, -1)
        out = out * torch.sigmoid(gate)
        return self.o_proj(out)
