"""Gemma 2's attention logits soft-capping: the scaled scores pass through cap * tanh(scores / cap) before the
causal mask and the softmax, so no logit grows past the cap."""

import torch
from torch import nn


class Gemma2StyleAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, attn_logit_softcapping=50.0):
        super().__init__()
        self.num_heads, self.head_dim = num_attention_heads, hidden_size // num_attention_heads
        self.softcap = attn_logit_softcapping
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        split = lambda y: y.view(b, t, self.num_heads, self.head_dim).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.q_proj(hidden_states)), split(self.k_proj(hidden_states)), split(self.v_proj(hidden_states))
        attn_weights = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
        attn_weights = torch.tanh(attn_weights / self.softcap) * self.softcap
        future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        attn_weights = attn_weights.masked_fill(future, torch.finfo(attn_weights.dtype).min)
        attn_weights = torch.softmax(attn_weights, dim=-1)
        return self.o_proj(torch.matmul(attn_weights, v).transpose(1, 2).reshape(b, t, -1))
