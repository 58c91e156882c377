"""Qwen3-Next-style gated attention with the gate applied after ``o_proj`` instead of before it: the gate,
computed per head from the widened q projection, multiplies the projected output's features."""

import torch
import torch.nn.functional as F
from torch import nn


class LateGateAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.head_dim = hidden_size // num_attention_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size * 2, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        q, gate = torch.chunk(self.q_proj(hidden_states).view(b, t, -1, self.head_dim * 2), 2, dim=-1)
        q = q.transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, t, -1, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out) * torch.sigmoid(gate.reshape(b, t, -1))
