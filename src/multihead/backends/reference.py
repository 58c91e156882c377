"""The reference backend: attention as a learner writes it, softmax in float32.

    scores  = q @ k^T * scale              (B, H, Lq, Lk)
    scores  = softcap * tanh(scores / softcap)   (only with softcap, Gemma 2)
    scores += bias; blocked -> dtype min   (the safe fill: never overflows, never NaN)
    weights = softmax(scores) over keys    (float32; with sinks, each row's denominator also
                                            gets exp(sink[h]), a logit that carries no value)
    weights[blocked] = 0                   then dropout
    out     = weights @ v                  (B, H, Lq, Dv)

Setting blocked weights to 0 *after* the softmax is what makes a fully masked row return exactly
zero with zero gradient: its uniform weights are all blocked, so nothing flows either way.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from multihead.backends.reasons import declines

if TYPE_CHECKING:
    from multihead.backends.problem import Problem


def repeat_kv(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, Hkv, L, D) -> (B, H, L, D): each kv head serves H // Hkv consecutive query heads."""
    groups = num_heads // t.shape[1]
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def attention_weights(q, k, keep=None, bias=None, scale: float = 1.0, softcap=None, sinks=None) -> torch.Tensor:
    """softmax(cap(q k^T * scale) + bias) over keys (and sinks) in at least float32, blocked entries 0.

    q (B, H, Lq, D), k (B, Hkv, Lk, D) -> (B, H, Lq, Lk). bias may also be a function scores -> scores
    (a mask with Mask.score_mod: see Mask.score_terms).
    """
    k = repeat_kv(k, q.shape[1])
    scores = q @ k.transpose(-2, -1)  # (B, H, Lq, Lk)
    scores = scores.to(torch.promote_types(scores.dtype, torch.float32)) * scale  # at least float32
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = bias(scores) if callable(bias) else scores + bias
    if keep is not None:
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    if sinks is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        B, H, Lq, _ = scores.shape
        sink = sinks.to(scores.dtype).view(1, H, 1, 1).expand(B, H, Lq, 1)  # one extra logit per row
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, Lq, Lk)
    if keep is not None:
        weights = weights.masked_fill(~keep, 0.0)
    return weights


def zero_where(where: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """t with exact zeros where `where` (broadcastable) is True, NaN included; one pass, grads blocked there."""
    return torch.where(where, torch.zeros((), dtype=t.dtype, device=t.device), t)


def connected_zeros(shape, dtype: torch.dtype, *tensors: torch.Tensor) -> torch.Tensor:
    """Exact zeros of `shape`, still connected to each of `tensors` (gradient 0), even where they hold NaN
    or inf, so that backward() reaches every input of a call that computed nothing."""
    yes = torch.ones((), dtype=torch.bool, device=tensors[0].device)
    zero = sum(zero_where(yes, t.reshape(-1)[:1]).sum() for t in tensors)  # 0-dim; an empty t sums to 0
    return zero.to(dtype).expand(shape)


def inert_keys(p: Problem, ix) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with every key that no query may see set to 0, so NaN or inf there never reaches out."""
    if p.mask is None:
        return p.k, p.v
    visible = p.mask.key_keep(ix)  # (B, 1, 1, Lk) or None
    if visible is None:
        return p.k, p.v
    hidden = ~visible.transpose(-1, -2)  # (B, 1, Lk, 1)
    return zero_where(hidden, p.k), zero_where(hidden, p.v)


MATERIALISES = declines("math.materialises", lambda p: "reference math materialises the (B, H, Lq, Lk) = "
                                                      f"{tuple(p.dims)} scores; slower")


class MathBackend:
    """Plan: None (the reference needs nothing prepared)."""

    name = "math"

    def plan(self, p: Problem, auto: bool = True):
        return MATERIALISES if auto else None

    def describe(self, p: Problem, plan=None) -> str:
        extras = "".join((", softcap" if p.softcap is not None else "", ", sinks" if p.sinks is not None else ""))
        return "plain matmul + float32 softmax + matmul" + extras

    def run(self, p: Problem, plan=None) -> torch.Tensor:
        ix = p.index()
        k, v = inert_keys(p, ix)
        keep, bias = p.mask.score_terms(ix, p.softmax_dtype) if p.mask is not None else (None, None)
        weights = attention_weights(p.q, k, keep, bias, p.scale, p.softcap, p.sinks)  # (B, H, Lq, Lk)
        if p.dropout:
            weights = F.dropout(weights, p.dropout)
        return weights.to(v.dtype) @ repeat_kv(v, p.q.shape[1])  # (B, H, Lq, Dv)
