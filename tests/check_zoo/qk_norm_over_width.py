"""Qwen3's per-head QK-norm written before the head split: the norm's weight has one entry per head feature
(RMSNorm(d_head), as in Qwen3), but the learner normalises q and k across all heads together (over d_model),
then applies the per-head weight; each head's q and k should be normalised over its own head_dim."""

import torch
import torch.nn.functional as F
from torch import nn


class NormedQKAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_model // n_heads
        self.to_q = nn.Linear(d_model, d_model, bias=False)
        self.to_k = nn.Linear(d_model, d_model, bias=False)
        self.to_v = nn.Linear(d_model, d_model, bias=False)
        self.to_out = nn.Linear(d_model, d_model, bias=False)
        self.q_norm = nn.RMSNorm(self.d_head, eps=1e-6)
        self.k_norm = nn.RMSNorm(self.d_head, eps=1e-6)

    def forward(self, x):
        b, n, d_model = x.shape
        q = F.rms_norm(self.to_q(x), (d_model,), eps=1e-6)  # (b, n, d_model): all heads at once
        k = F.rms_norm(self.to_k(x), (d_model,), eps=1e-6)
        q, k, v = (t.view(b, n, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, self.to_v(x)))
        q, k = q * self.q_norm.weight, k * self.k_norm.weight
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
