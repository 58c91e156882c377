"""A learner's multi-query decoder attention (one key/value head shared by every query head) on
``F.scaled_dot_product_attention``, with a cache handed back as ``(y, (k, v))``: causal on the prompt,
and a single new token sees every cached key."""

import torch
import torch.nn.functional as F
from torch import nn


class MultiQueryAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, self.head_dim)
        self.v = nn.Linear(d_model, self.head_dim)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, layer_past=None, use_cache=False):
        B, T, C = x.shape
        q = self.q(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k, v = self.k(x).unsqueeze(1), self.v(x).unsqueeze(1)  # (B, 1, T, head_dim) each
        if layer_past is not None:
            k = torch.cat((layer_past[0], k), dim=2)
            v = torch.cat((layer_past[1], v), dim=2)
        S = k.shape[2]
        y = F.scaled_dot_product_attention(q, k.expand(B, self.n_heads, S, self.head_dim),
                                           v.expand(B, self.n_heads, S, self.head_dim), is_causal=layer_past is None)
        y = self.out(y.transpose(1, 2).reshape(B, T, C))
        return (y, (k, v)) if use_cache else y
