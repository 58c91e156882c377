"""Converter for Hugging Face GPT-2 attention (`model.h[i].attn`, GPT2Attention): Conv1D c_attn / c_proj.

GPT-2 keeps its projections in transformers' `Conv1D`, a linear layer stored the other way round:

    Conv1D(nf, nx): weight (nx, nf) = (in, out), bias (nf,);  y = x @ weight + bias
    nn.Linear:      weight (out, in);                          y = x @ weight.T + bias

so a Conv1D is the nn.Linear with weight.T. c_attn is Conv1D(3E, E): its output columns are the
query, then the key, then the value, E each (`split(E, dim=2)`); head h owns columns h*D .. (h+1)*D
of each. c_proj is Conv1D(E, E), the output projection.

    GPT2Attention                               MultiHeadAttention
    c_attn.weight[:, 0:E].T, bias[0:E]          q_proj (E, E)        (k: columns E..2E, v: 2E..3E)
    c_proj.weight.T, c_proj.bias                out_proj (E, E)
    num_heads, causal (is_causal)               num_heads, causal=True
    scaling: D ** -0.5 (scale_attn_weights),    scale (None when D ** -0.5)
      1.0 without it, / (layer_idx + 1) with
      scale_attn_by_inverse_layer_idx
    attn_dropout.p                              dropout (on the attention weights)

reorder_and_upcast_attn changes only the order of float32 work, not the result. GPT-2's positions
are learned absolute embeddings added to the input before the first layer, so nothing about them
belongs to attention. Left out: resid_dropout after c_proj (a no-op in eval mode; in training it is
the block's dropout, not attention's). Cross-attention (q_attn, is_cross_attention) is refused.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.convert.hf.config import hf_causal, hf_scale
from multihead.convert.model_attributes import model_attribute
from multihead.convert.projections import build_attention, check_no_extra_linears, find_dropout, require_head_count
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError, shape_str
from multihead.layers.multi_head import MultiHeadAttention

STYLE = "Hugging Face GPT-2 (Conv1D c_attn/c_proj)"


def is_conv1d(layer) -> bool:
    """True for transformers' Conv1D: a module with `nf` outputs and a 2-D weight (in, nf)."""
    weight, nf = getattr(layer, "weight", None), getattr(layer, "nf", None)
    return (isinstance(layer, nn.Module) and isinstance(nf, int) and isinstance(weight, torch.Tensor)
            and weight.dim() == 2 and weight.shape[1] == nf)


def conv1d_as_linear(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight (out, in), bias (out,) or None) of a Conv1D, in nn.Linear layout."""
    return layer.weight.detach().T, None if layer.bias is None else layer.bias.detach()


@register_converter(STYLE)
def convert_gpt2_attention(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """GPT2Attention -> a causal MultiHeadAttention; None when c_attn / c_proj are not Conv1D layers."""
    c_attn, c_proj = getattr(module, "c_attn", None), getattr(module, "c_proj", None)
    if not (is_conv1d(c_attn) and is_conv1d(c_proj)):
        return None
    if model_attribute(module, "is_cross_attention", False) or model_attribute(module, "q_attn", None) is not None:
        raise AttentionError(
            f"{type(module).__name__} is GPT-2 cross-attention (q_attn on the decoder, c_attn on the encoder's "
            "states); only GPT-2's self-attention converts."
        )
    check_no_extra_linears(module, (), STYLE)
    weight, bias = conv1d_as_linear(c_attn)  # (3E, E), (3E,)
    if weight.shape[0] % 3:
        raise AttentionError(
            f"c_attn must hold q, k and v: 3 x E outputs; got weight {shape_str(c_attn.weight.shape)}."
        )
    width = weight.shape[0] // 3
    biases = (None,) * 3 if bias is None else bias.split(width)
    q, k, v = zip(weight.split(width), biases)  # query rows, key rows, value rows
    num_heads = require_head_count(module, hints, STYLE)
    return build_attention(q, k, v, conv1d_as_linear(c_proj), num_heads, batch_first=hints.get("batch_first", True),
                           dropout=find_dropout(module, "attn_dropout"),
                           causal=hf_causal(module, hints, None),
                           training=module.training, scale=hf_scale(module, width // num_heads))
