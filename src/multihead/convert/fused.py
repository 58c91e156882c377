"""Converter for nanoGPT's fused projection: `c_attn` = Linear(E, 3E) holding q, k, v; `c_proj` = Linear(E, E).

nanoGPT computes `q, k, v = c_attn(x).split(E, dim=2)`, so the rows of c_attn's weight (3E, E) are
the query rows, then the key rows, then the value rows: three (E, E) blocks. The head count is
`n_head`; the layout is batch-first (B, L, E). nanoGPT's attention is always causal, so the converted
module is built with causal=True (the hint causal=False says otherwise).
"""
from __future__ import annotations

from torch import nn

from multihead.convert.projections import (build_attention, check_no_extra_linears, find_dropout, linear_at,
                                           require_head_count, weight_and_bias)
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError, shape_str
from multihead.layers.multi_head import MultiHeadAttention


@register_converter("nanoGPT fused c_attn/c_proj")
def convert_fused_c_attn(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """c_attn (3E, E) split into q/k/v rows, c_proj as the output; None when the names are not there."""
    c_attn, c_proj = linear_at(module, "c_attn"), linear_at(module, "c_proj")
    if c_attn is None or c_proj is None:
        return None
    check_no_extra_linears(module, (c_attn, c_proj), "nanoGPT's fused c_attn/c_proj")
    weight, bias = weight_and_bias(c_attn, "fused c_attn")
    if weight.shape[0] % 3:
        raise AttentionError(
            f"c_attn must hold q, k and v stacked: 3 x E output features; got weight {shape_str(weight.shape)}."
        )
    width = weight.shape[0] // 3
    weights = weight.split(width, dim=0)  # 3 x (E, E): query rows, key rows, value rows
    biases = bias.split(width, dim=0) if bias is not None else (None, None, None)
    q, k, v = zip(weights, biases)
    num_heads = require_head_count(module, hints, "nanoGPT's fused c_attn/c_proj")
    return build_attention(q, k, v, c_proj, num_heads, batch_first=hints.get("batch_first", True),
                           dropout=find_dropout(module, "attn_dropout"), causal=hints.get("causal", True),
                           training=module.training)
