"""Converter for stacked heads: `heads`, an nn.ModuleList of single attention heads, outputs concatenated.

This is document 001's lesson read backwards. Head h has its own W_query / W_key / W_value of shape
(D, E); stacking the H heads' weights row-wise gives one (H*D, E) matrix per projection, exactly the
weight-split version's Wq / Wk / Wv, where head h owns rows [h*D, (h+1)*D). Document 001 has no
output projection: the result's out_proj is the identity, so its output is the heads' concatenation
(B, L, H*D). Where the stacking module projects the concatenation (a Linear named proj, out_proj,
o_proj, W_o, Wo or output, as in the common `heads` + `proj` GPT lecture code), that is out_proj.
Heads that keep a causal mask buffer (document 001's CausalAttention) give a causal module.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.convert.projections import (build_attention, check_no_extra_linears, find_dropout,
                                           has_causal_buffer, linear_at, submodule, weight_and_bias)
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError, shape_str
from multihead.layers.multi_head import MultiHeadAttention

# How a single head may name its three projections (document 001's CausalAttention first).
SINGLE_HEAD_NAMES = (("W_query", "W_key", "W_value"), ("W_q", "W_k", "W_v"), ("query", "key", "value"),
                     ("q_linear", "k_linear", "v_linear"))
# Where a stacking module may keep the projection of the concatenated heads (none in document 001).
OUTPUT_NAMES = ("proj", "out_proj", "o_proj", "W_o", "Wo", "output")


def _head_projections(head: nn.Module, names: tuple[str, str, str], index: int):
    """[(weight (D, E), bias (D,) or None)] for the head's q, k, v; AttentionError if one is missing."""
    layers = [linear_at(head, name) for name in names]
    if any(layer is None for layer in layers):
        raise AttentionError(
            f"heads[{index}] ({type(head).__name__}) lacks the projections {names} that heads[0] has; "
            "stacked heads must all be built the same way."
        )
    check_no_extra_linears(head, layers, f"a single head {names}")
    return [weight_and_bias(layer, f"heads[{index}].{name}") for layer, name in zip(layers, names)]


def _stack(pairs: list, role: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-head (weight (D, E), bias) pairs -> (weight (H*D, E), bias (H*D,) or None), head h at rows h*D."""
    weights, biases = zip(*pairs)
    shapes = {tuple(w.shape) for w in weights}
    if len(shapes) != 1:
        raise AttentionError(
            f"the heads' {role} weights differ in shape ({', '.join(shape_str(w.shape) for w in weights)}); "
            "stacked heads must all have the same size."
        )
    if len({b is None for b in biases}) != 1:
        raise AttentionError(f"some heads' {role} projections have a bias and some do not; expected all or none.")
    bias = None if biases[0] is None else torch.cat(biases)  # (H*D,)
    return torch.cat(weights), bias  # (H*D, E)


@register_converter("stacked heads (heads: ModuleList of single heads)")
def convert_stacked_heads(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """`heads` = [head_0, ..., head_{H-1}], each with q/k/v projections (D, E) -> H heads; out or identity."""
    heads = submodule(module, "heads")
    if not isinstance(heads, nn.ModuleList) or len(heads) == 0:
        return None
    names = next((n for n in SINGLE_HEAD_NAMES if all(linear_at(heads[0], name) is not None for name in n)), None)
    if names is None:
        return None
    if hints.get("num_heads") not in (None, len(heads)):
        raise AttentionError(f"num_heads={hints['num_heads']} but the module stacks {len(heads)} heads.")
    out = next((found for name in OUTPUT_NAMES if (found := linear_at(module, name)) is not None), None)
    check_no_extra_linears(module, [*heads.modules(), out], "stacked heads")
    per_head = [_head_projections(head, names, index) for index, head in enumerate(heads)]
    q, k, v = (_stack([projections[i] for projections in per_head], role)
               for i, role in enumerate(("query", "key", "value")))
    return build_attention(q, k, v, out, len(heads), batch_first=hints.get("batch_first", True),
                           dropout=find_dropout(heads[0], "dropout"),
                           causal=hints.get("causal", has_causal_buffer(module, heads[0])), training=module.training)
