# Correct: projections as raw parameters, one (heads, d_model, d_head) tensor per role, applied with einsum
# (the style of interpretability code); the output parameter (heads, d_head, d_model) sums over heads.
import math

import torch
from torch import nn


class EinsumParamAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        d_head = d_model // n_heads
        self.W_Q = nn.Parameter(torch.randn(n_heads, d_model, d_head) / math.sqrt(d_model))
        self.W_K = nn.Parameter(torch.randn(n_heads, d_model, d_head) / math.sqrt(d_model))
        self.W_V = nn.Parameter(torch.randn(n_heads, d_model, d_head) / math.sqrt(d_model))
        self.W_O = nn.Parameter(torch.randn(n_heads, d_head, d_model) / math.sqrt(d_model))
        self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_O = nn.Parameter(torch.zeros(d_model))

    def forward(self, resid):
        q = torch.einsum("bpd,hde->bphe", resid, self.W_Q) + self.b_Q
        k = torch.einsum("bpd,hde->bphe", resid, self.W_K)
        v = torch.einsum("bpd,hde->bphe", resid, self.W_V)
        scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(q.shape[-1])
        pattern = scores.softmax(dim=-1)
        z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
        return torch.einsum("bqhe,hem->bqm", z, self.W_O) + self.b_O
