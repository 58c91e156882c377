# BERT-like self-attention with a (B, L) padding mask (1 = real token), applied after the softmax.
import math

import torch
from torch import nn


class BertishSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.n = num_attention_heads
        self.size = hidden_size // num_attention_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def split(self, t):
        return t.view(t.shape[0], t.shape[1], self.n, self.size).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        q, k, v = (self.split(f(hidden_states)) for f in (self.query, self.key, self.value))
        probs = nn.functional.softmax(q @ k.transpose(-1, -2) / math.sqrt(self.size), dim=-1)
        if attention_mask is not None:
            probs = probs * attention_mask[:, None, None, :]
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(hidden_states.shape)
        return self.dense(ctx)
