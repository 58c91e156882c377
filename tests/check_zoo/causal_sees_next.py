# Causal self-attention whose buffer lets each token see one token ahead (tril with diagonal=1).
import math

import torch
import torch.nn as nn


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, block_size):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.register_buffer("allowed", torch.tril(torch.ones(block_size, block_size), diagonal=1))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.n_heads, -1).transpose(1, 2) for t in (q, k, v))
        att = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
        att = att.masked_fill(self.allowed[:T, :T] == 0, float("-inf"))
        y = att.softmax(-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))
