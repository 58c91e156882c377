# Correct: cross-attention with to_q and a fused to_kv, no biases, additive float mask.
import torch
from torch import nn


class XAttn(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.to_q = nn.Linear(dim, dim, bias=False)
        self.to_kv = nn.Linear(dim, 2 * dim, bias=False)
        self.to_out = nn.Linear(dim, dim)

    def forward(self, x, context, attn_bias=None):
        q = self.to_q(x)
        k, v = self.to_kv(context).chunk(2, dim=-1)
        b, n, _ = q.shape
        q, k, v = (t.reshape(b, t.shape[1], self.heads, -1).permute(0, 2, 1, 3) for t in (q, k, v))
        sim = torch.einsum("bhid,bhjd->bhij", q, k) * q.shape[-1] ** -0.5
        if attn_bias is not None:
            sim = sim + attn_bias
        out = torch.einsum("bhij,bhjd->bhid", sim.softmax(dim=-1), v)
        return self.to_out(out.permute(0, 2, 1, 3).reshape(b, n, -1))
