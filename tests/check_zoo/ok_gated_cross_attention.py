"""A learner's gated cross-attention: the output gate of Qwen3-Next (QwenLM/Qwen3-Next) on cross-attention."""

import torch
import torch.nn.functional as F
from torch import nn


class GatedCross(nn.Module):
    """Cross-attention with a Qwen3-Next-style output gate (QwenLM/Qwen3-Next): context of width 12, queries of
    width 16, sigmoid(gate(x)) * attention before the output projection."""
    def __init__(self, query_dim=16, context_dim=12, heads=4):
        super().__init__()
        self.h = heads
        self.to_q = nn.Linear(query_dim, 16)
        self.to_k = nn.Linear(context_dim, 16)
        self.to_v = nn.Linear(context_dim, 16)
        self.gate = nn.Linear(query_dim, 16)
        self.to_out = nn.Linear(16, query_dim)
    def forward(self, x, context):
        b, n, _ = x.shape
        m = context.shape[1]
        q = self.to_q(x).view(b, n, self.h, -1).transpose(1, 2)
        k = self.to_k(context).view(b, m, self.h, -1).transpose(1, 2)
        v = self.to_v(context).view(b, m, self.h, -1).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, -1)
        return self.to_out(o * torch.sigmoid(self.gate(x)))
