"""A compact decoder attention written with einsum: interleaved rotary pairs (x[2i], x[2i+1]), then QK-norm
with learned per-feature weights applied after the rotation (nn.RMSNorm(head_dim); norm_weight=False drops
the weights)."""

import torch
from torch import nn


def rotate_pairs(x, positions, base=10000.0):
    d = x.shape[-1]
    freqs = positions[:, None].float() * base ** (-torch.arange(0, d, 2, device=x.device).float() / d)
    cos, sin = freqs.cos().repeat_interleave(2, -1).to(x.dtype), freqs.sin().repeat_interleave(2, -1).to(x.dtype)
    x1, x2 = x[..., 0::2], x[..., 1::2]
    turned = torch.stack((-x2, x1), dim=-1).flatten(-2)
    return x * cos + turned * sin


class RotaryNormAttention(nn.Module):
    def __init__(self, d_model, n_heads, norm_weight=True):
        super().__init__()
        self.h, self.dh = n_heads, d_model // n_heads
        self.wqkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)
        self.qn = nn.RMSNorm(self.dh, eps=1e-5, elementwise_affine=norm_weight)
        self.kn = nn.RMSNorm(self.dh, eps=1e-5, elementwise_affine=norm_weight)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.wqkv(x).view(b, t, 3, self.h, self.dh).unbind(dim=2)  # each (b, t, h, dh)
        pos = torch.arange(t, device=x.device)
        q = self.qn(rotate_pairs(q.transpose(1, 2), pos))
        k = self.kn(rotate_pairs(k.transpose(1, 2), pos))
        s = torch.einsum("bhid,bhjd->bhij", q, k) / self.dh ** 0.5
        s = s.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1), float("-inf"))
        o = torch.einsum("bhij,bjhd->bihd", s.softmax(-1), v)
        return self.wo(o.reshape(b, t, -1))
