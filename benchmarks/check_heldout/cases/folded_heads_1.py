"""Cross-attention in the style of latent-diffusion code: to_q on x, to_k / to_v on a context, the heads
folded into the batch as (b h) n d for the batched matmuls, and an optional boolean mask (b, j) on the
context tokens, True = keep."""
import torch
from torch import einsum, nn


class CrossAttention(nn.Module):
    def __init__(self, query_dim, context_dim=None, heads=8, dim_head=64, dropout=0.0):
        super().__init__()
        inner_dim = dim_head * heads
        context_dim = query_dim if context_dim is None else context_dim
        self.scale = dim_head ** -0.5
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner_dim, bias=False)
        self.to_k = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_v = nn.Linear(context_dim, inner_dim, bias=False)
        self.to_out = nn.Linear(inner_dim, query_dim)
        self.dropout = nn.Dropout(dropout)

    def fold(self, t):
        """(b, n, h * d) -> (b * h, n, d); row b * heads + h is batch b, head h"""
        b, n, _ = t.shape
        return t.view(b, n, self.heads, -1).permute(0, 2, 1, 3).reshape(b * self.heads, n, -1)

    def unfold(self, t):
        """(b * h, n, d) -> (b, n, h * d)"""
        bh, n, d = t.shape
        return t.view(bh // self.heads, self.heads, n, d).permute(0, 2, 1, 3).reshape(bh // self.heads, n, -1)

    def forward(self, x, context=None, mask=None):
        context = x if context is None else context
        q, k, v = self.fold(self.to_q(x)), self.fold(self.to_k(context)), self.fold(self.to_v(context))

        sim = einsum("b i d, b j d -> b i j", q, k) * self.scale
        if mask is not None:
            max_neg_value = -torch.finfo(sim.dtype).max
            mask = mask[:, None, :].repeat(self.heads, 1, 1)  # (b * h, 1, j)
            sim.masked_fill_(~mask, max_neg_value)

        attn = self.dropout(sim.softmax(dim=-1))
        out = einsum("b i j, b j d -> b i d", attn, v)
        return self.to_out(self.unfold(out))
