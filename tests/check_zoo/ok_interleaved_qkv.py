# Correct: one fused projection laid out per head as (H, 3, D) rows (Megatron style), no output bias.
import math

import torch
from torch import nn


class InterleavedAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states):
        B, L, E = hidden_states.shape
        mixed = self.query_key_value(hidden_states).view(B, L, self.num_heads, 3 * (E // self.num_heads))
        q, k, v = mixed.chunk(3, dim=-1)  # each (B, L, H, D)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        probs = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=-1)
        context = (probs @ v).transpose(1, 2).reshape(B, L, E)
        return self.dense(context)
