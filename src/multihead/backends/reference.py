"""The reference backend: attention as a learner writes it, softmax in float32.

    scores  = q @ k^T * scale             (B, H, Lq, Lk)
    scores += bias; blocked -> dtype min  (the safe fill: never overflows, never NaN)
    weights = softmax(scores) over keys   (float32), then blocked weights set to exactly 0
    out     = weights @ v                 (B, H, Lq, Dv)

Setting blocked weights to 0 *after* the softmax is what makes a fully masked row return exactly
zero with zero gradient: its uniform weights are all blocked, so nothing flows either way.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multihead.backends.problem import Problem


def repeat_kv(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, Hkv, L, D) -> (B, H, L, D): each kv head serves H // Hkv consecutive query heads."""
    groups = num_heads // t.shape[1]
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def attention_weights(q, k, keep=None, bias=None, scale: float = 1.0) -> torch.Tensor:
    """softmax(q k^T * scale + bias) over keys in (at least) float32, blocked entries exactly 0. (B, H, Lq, Lk)."""
    k = repeat_kv(k, q.shape[1])
    scores = q @ k.transpose(-2, -1)  # (B, H, Lq, Lk)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale  # at least float32
    if bias is not None:
        scores = scores + bias
    if keep is not None:
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)
    if keep is not None:
        weights = weights.masked_fill(~keep, 0.0)
    return weights


class MathBackend:
    name = "math"

    def unsupported(self, p: Problem) -> str | None:
        return None

    def declines(self, p: Problem) -> str | None:
        B, H, Lq, Lk = p.dims
        return f"reference math materialises the (B, H, Lq, Lk) = ({B}, {H}, {Lq}, {Lk}) scores; slower"

    def describe(self, p: Problem) -> str:
        return "plain matmul + float32 softmax + matmul"

    def run(self, p: Problem) -> torch.Tensor:
        keep, bias = p.dense_mask()
        weights = attention_weights(p.q, p.k, keep, bias, p.scale)  # (B, H, Lq, Lk) float32
        if p.dropout:
            weights = F.dropout(weights, p.dropout)
        return weights.to(p.v.dtype) @ repeat_kv(p.v, p.q.shape[1])  # (B, H, Lq, Dv)
