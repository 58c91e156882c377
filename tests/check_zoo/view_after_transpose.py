# Heads merged with view() right after transpose(): PyTorch refuses (non-contiguous memory).
import math

import torch
import torch.nn as nn


class ViewMHA(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden_size // num_heads
        self.q_linear = nn.Linear(hidden_size, hidden_size)
        self.k_linear = nn.Linear(hidden_size, hidden_size)
        self.v_linear = nn.Linear(hidden_size, hidden_size)
        self.o_linear = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_state, attention_mask=None):
        B, L, E = hidden_state.shape
        q = self.q_linear(hidden_state).reshape(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_linear(hidden_state).reshape(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v_linear(hidden_state).reshape(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            scores = scores + attention_mask * -1e9
        out = torch.softmax(scores, dim=-1) @ v
        out = out.transpose(1, 2).view(B, L, E)
        return self.o_linear(out)
