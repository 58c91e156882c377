"""QK-norm written with the model's own RMSNorm over the full width: q and k are normalised across all heads
together, before the split, where each head's q and k should be normalised over its own head_dim."""

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
        self.q_norm = nn.RMSNorm(d_model, eps=1e-6)
        self.k_norm = nn.RMSNorm(d_model, eps=1e-6)

    def forward(self, x):
        b, n, _ = x.shape
        q = self.q_norm(self.to_q(x))  # (b, n, d_model): all heads at once
        k = self.k_norm(self.to_k(x))
        q, k, v = (t.view(b, n, self.n_heads, self.d_head).transpose(1, 2) for t in (q, k, self.to_v(x)))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))
