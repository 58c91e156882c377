# Cross-attention with a keep mask; the heads are merged back without transposing first.
import torch
from torch import nn


class CrossAttention(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.d_head = d_model // heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model)

    def _heads(self, t):
        B, L, _ = t.shape
        return t.view(B, L, self.heads, self.d_head).permute(0, 2, 1, 3)

    def forward(self, query, key, value, mask=None):
        B, Lq, E = query.shape
        q, k, v = self._heads(self.wq(query)), self._heads(self.wk(key)), self._heads(self.wv(value))
        scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * self.d_head ** -0.5
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        ctx = weights @ v
        ctx = ctx.reshape(B, Lq, E)
        return self.wo(ctx)
