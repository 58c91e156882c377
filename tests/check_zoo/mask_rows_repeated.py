# Heads folded into the batch as (b h), but the (B, Lk) mask repeated with repeat(h, 1, 1): folded row
# b * h + i gets the mask of batch (b * h + i) % B.
import torch
from torch import nn


class FoldedCrossAttention(nn.Module):
    def __init__(self, query_dim, heads, dim_head):
        super().__init__()
        self.heads, self.scale = heads, dim_head ** -0.5
        inner = heads * dim_head
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(query_dim, inner, bias=False)
        self.to_v = nn.Linear(query_dim, inner, bias=False)
        self.to_out = nn.Linear(inner, query_dim)

    def fold(self, t):
        b, n, hd = t.shape
        return t.view(b, n, self.heads, -1).transpose(1, 2).reshape(b * self.heads, n, -1)

    def forward(self, x, context=None, mask=None):
        context = x if context is None else context
        q, k, v = self.fold(self.to_q(x)), self.fold(self.to_k(context)), self.fold(self.to_v(context))
        sim = torch.bmm(q, k.transpose(1, 2)) * self.scale
        if mask is not None:
            sim = sim.masked_fill(~mask[:, None, :].repeat(self.heads, 1, 1), -torch.finfo(sim.dtype).max)
        out = torch.bmm(sim.softmax(-1), v)
        b = x.shape[0]
        return self.to_out(out.view(b, self.heads, -1, out.shape[-1]).transpose(1, 2).reshape(b, x.shape[1], -1))
