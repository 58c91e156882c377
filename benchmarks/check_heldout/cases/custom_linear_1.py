"""Multi-head attention built on a home-made Linear (an nn.Module holding its weight and calling F.linear),
the way reference inference code keeps room for quantised weights. The caller passes an additive
(seqlen, seqlen) mask, e.g. torch.full((L, L), float("-inf")).triu(1) for a decoder."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """y = x W^T + b; the one place a quantised kernel would plug in."""
    return F.linear(x, weight, bias)


class Linear(nn.Module):
    """A linear layer whose weight is (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False, dtype=None):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        nn.init.normal_(self.weight, std=in_features ** -0.5)
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features))
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


class Attention(nn.Module):
    """Attributes: n_heads, head_dim, softmax_scale, and the projections wq, wk, wv, wo."""

    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.wq = Linear(dim, dim)
        self.wk = Linear(dim, dim)
        self.wv = Linear(dim, dim)
        self.wo = Linear(dim, dim)
        self.softmax_scale = self.head_dim ** -0.5

    def forward(self, x: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        bsz, seqlen, _ = x.size()
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        scores = torch.einsum("bshd,bthd->bsht", q, k) * self.softmax_scale
        if mask is not None:
            scores += mask.unsqueeze(1)
        scores = scores.softmax(dim=-1)
        out = torch.einsum("bsht,bthd->bshd", scores, v)
        return self.wo(out.flatten(2))
