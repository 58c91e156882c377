"""attention_with_weights: the output *and* the weights that made it, for callers that return both.

    out, weights = attention_with_weights(q, k, v, mask, causal=..., scale=..., dropout=...)
                   q (B, H, Lq, D), k/v (B, Hkv, Lk, D/Dv)  ->  out (B, H, Lq, Dv), weights (B, H, Lq, Lk)

nn.MultiheadAttention(need_weights=True) and Hugging Face's output_attentions=True both hand back
the weights their output was computed from, after dropout. So this runs the reference path (a dense
softmax, float32 or wider) and computes the output from those very weights. Blocked entries are
exactly 0; a query that keeps no key has all-zero weights and a zero output.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multihead.backends.common import inert_keys, reference_weights, repeat_kv
from multihead.backends.problem import make_problem


def attention_with_weights(q, k, v, mask=None, *, causal=False, scale=None, softcap=None, sinks=None,
                           dropout=0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Lq, Dv) in v's dtype, weights (B, H, Lq, Lk) in the softmax dtype); see mh.attention."""
    p = make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks)
    keep, bias = p.dense_mask()
    weights = reference_weights(p.q, p.k, keep, bias, p.scale, p.softcap, p.sinks)  # (B, H, Lq, Lk)
    if p.dropout:
        weights = F.dropout(weights, p.dropout)
    _, v = inert_keys(p.form, p.index(), p.k, p.v)  # NaN stored at keys nobody sees stays out
    out = weights.to(v.dtype) @ repeat_kv(v, q.shape[1])  # (B, H, Lq, Dv)
    return out, weights
