"""Converter for Hugging Face GPT-NeoX attention (`model.layers[i].attention`, GPTNeoXAttention).

GPT-NeoX (Pythia, GPT-NeoX-20B) packs its three projections into one Linear(E, 3E),
`query_key_value`, grouped per head: its output is viewed as (B, L, H, 3*D) and each head's 3*D
features are that head's query, key and value, D each. So its weight rows, (3E, E), are

    head 0: q (D rows), k (D), v (D) | head 1: q, k, v | ...    i.e. weight.view(H, 3, D, E)

unlike nanoGPT's c_attn (all queries, then all keys, then all values). Unpacking takes
weight.view(H, 3, D, E)[:, 0] -> (H*D, E) as q_proj (1: k_proj, 2: v_proj), the bias the same way.

    GPTNeoXAttention                            MultiHeadAttention
    query_key_value (per head q, k, v)          q_proj, k_proj, v_proj (E, E); bias if attention_bias
    dense                                       out_proj
    rotary: half-split (rotate_half) on the     rope=RoPE(D, base=rope_theta, rotary_dim=R), R =
      first R = int(D * partial_rotary_factor)  int(D * partial_rotary_factor); the other D - R
      features of each head (rotary_pct; 0.25)  features pass through unturned
    scaling = D ** -0.5, is_causal              causal=True
    attention_dropout                           dropout

The rotary embedding is the model's (config.rope_parameters); the converted module rebuilds it.
Other models with a query_key_value / dense pair (Falcon, BLOOM, Persimmon) pack or position
differently and are refused.
"""
from __future__ import annotations

from torch import nn

from multihead.convert.hf.config import hf_causal, hf_config, hf_dropout, hf_rope, hf_scale
from multihead.convert.projections import (build_attention, check_no_extra_linears, linear_at, require_head_count,
                                           weight_and_bias)
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError, shape_str
from multihead.layers.multi_head import MultiHeadAttention

STYLE = "Hugging Face GPT-NeoX (query_key_value packed per head, dense)"


@register_converter(STYLE)
def convert_neox_attention(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """GPTNeoXAttention -> a causal MultiHeadAttention with (partial) RoPE; None for other names."""
    packed, dense = linear_at(module, "query_key_value"), linear_at(module, "dense")
    config = hf_config(module)
    if packed is None or dense is None or config is None:
        return None
    if config.model_type != "gpt_neox":
        raise AttentionError(
            f"{type(module).__name__} comes from a Hugging Face {config.model_type!r} model; its query_key_value "
            "is read here as GPT-NeoX packs it (per head: q, k, v), expected model_type 'gpt_neox'."
        )
    check_no_extra_linears(module, (packed, dense), STYLE)
    num_heads = require_head_count(module, hints, STYLE)
    weight, bias = weight_and_bias(packed, "query_key_value")
    E = weight.shape[1]
    if weight.shape[0] % (3 * num_heads):
        raise AttentionError(f"query_key_value must hold q, k, v for {num_heads} heads (3 x H x D outputs); "
                             f"got weight {shape_str(weight.shape)}.")
    D = weight.shape[0] // (3 * num_heads)
    per_head = weight.detach().view(num_heads, 3, D, E)  # head h: rows for its q, k, v
    bias_per_head = None if bias is None else bias.detach().view(num_heads, 3, D)
    q, k, v = ((per_head[:, i].reshape(num_heads * D, E),
                None if bias is None else bias_per_head[:, i].reshape(num_heads * D)) for i in range(3))
    return build_attention(q, k, v, dense, num_heads, batch_first=hints.get("batch_first", True),
                           dropout=hf_dropout(module), causal=hf_causal(module, hints, None),
                           training=module.training, scale=hf_scale(module, D),
                           rope=hf_rope(module, config, D, whole_head=False, device=weight.device))
