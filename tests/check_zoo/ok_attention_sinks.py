"""gpt-oss-style attention sinks: each head learns one extra logit that joins the softmax over the keys but
carries no value, so a head can attend to "nowhere"."""

import torch
from torch import nn


class SinkAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_attention_heads, hidden_size // num_attention_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.o_proj = nn.Linear(hidden_size, hidden_size)
        self.sinks = nn.Parameter(torch.zeros(num_attention_heads))

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        attn_weights = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        causal = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        attn_weights = attn_weights.masked_fill(causal, float("-inf"))
        sinks = self.sinks.reshape(1, -1, 1, 1).expand(b, -1, t, -1)
        combined = torch.cat([attn_weights, sinks], dim=-1)
        combined = combined - combined.max(dim=-1, keepdim=True).values
        probs = nn.functional.softmax(combined, dim=-1)
        scores = probs[..., :-1]  # the sink's share is dropped
        out = torch.matmul(scores, v).transpose(1, 2).reshape(b, t, -1)
        return self.o_proj(out)
