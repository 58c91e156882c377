"""What a Hugging Face decoder's attention says beyond its weights: positions, scale, causality, window.

transformers keeps these in two places. The attention module itself holds `scaling` (the factor on
q·k), `is_causal`, `attention_dropout` and, in models that alternate layer kinds, its own
`sliding_window` (None on full-attention layers) and `layer_type`. The model's config (`module.config`)
holds the rotary embedding: in transformers 5, `config.rope_parameters`, a dict with "rope_type",
"rope_theta" and the scaling kind's own keys (possibly "partial_rotary_factor"); the cos/sin it gives
are computed once per forward by the model's rotary embedding and passed to every layer. Converting
one layer therefore rebuilds that rotary embedding as an mh.RoPE inside the converted module.

The converters in hf_decoders, hf_gpt2 and hf_neox read these through the functions below, so that
each of them states only its model's own weight layout; the functions read each attribute through
model_attributes.model_attribute, which knows its spellings.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

from torch import nn

from multihead.convert.model_attributes import model_attribute
from multihead.errors import AttentionError
from multihead.positions import RoPE


def hf_config(module: nn.Module):
    """The module's transformers config (anything with `model_type`), or None when it has none."""
    config = model_attribute(module, "config", None)
    return config if isinstance(model_attribute(config, "model_type", None), str) else None


def hf_rope(module: nn.Module, config, head_dim: int, *, whole_head: bool, interleaved: bool = False, device=None):
    """An mh.RoPE equal to the rotary embedding the model computes from `config` for this layer.

    whole_head=True for models whose attention turns all D features whatever the dict says (Llama and
    its cousins read head_dim alone); False where "partial_rotary_factor" sets R < D (GPT-NeoX).
    interleaved: pairs of neighbouring features (2k, 2k + 1) turn together (Llama 4, DeepSeek), not halves.
    Raises AttentionError for rope kinds mh.RoPE does not compute.
    """
    params = model_attribute(config, "rope_parameters", None)
    if not isinstance(params, Mapping) or "rope_theta" not in _layer_params(params, module):
        raise AttentionError(
            f"{config.model_type} attention: expected config.rope_parameters with 'rope_theta' (transformers 5); "
            f"got {params!r}."
        )
    params = dict(_layer_params(params, module))
    if whole_head:
        params.pop("partial_rotary_factor", None)
    try:
        return RoPE(head_dim, base=float(params["rope_theta"]), interleaved=interleaved, scaling=params,
                    max_position=model_attribute(config, "max_position_embeddings", None), device=device)
    except AttentionError as error:
        raise AttentionError(f"{config.model_type} attention's rope_parameters {params}: {error}") from None


def _layer_params(params: Mapping, module: nn.Module) -> Mapping:
    """The rope dict for this layer: models with per-layer-type rope keep {layer_type: dict}."""
    layer_type = model_attribute(module, "layer_type", None)
    return params[layer_type] if isinstance(params.get(layer_type), Mapping) else params


def hf_scale(module: nn.Module, head_dim: int) -> float | None:
    """The module's `scaling` on q·k; None when it is the usual 1/sqrt(head_dim)."""
    scaling = model_attribute(module, "scaling", None)
    if isinstance(scaling, bool) or not isinstance(scaling, (int, float)) or not 0 < scaling < math.inf:
        raise AttentionError(
            f"{type(module).__name__} should say its factor on q·k in `scaling` (a positive number, as "
            f"transformers 5 does); got {scaling!r}."
        )
    return None if math.isclose(scaling, head_dim ** -0.5, rel_tol=1e-12) else float(scaling)


def hf_dropout(module: nn.Module) -> float:
    """The probability of dropout on the attention weights (`attention_dropout`), 0 when absent."""
    p = model_attribute(module, "attention_dropout", 0.0)
    return float(p or 0.0)


def hf_window(module: nn.Module, config) -> int | None:
    """The sliding window of this layer: the module's own `sliding_window` when it keeps one (models
    with alternating layers set it None on full layers), else the config's (Mistral: every layer)."""
    window = model_attribute(module, "sliding_window", model_attribute(config, "sliding_window", None))
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window <= 0):
        raise AttentionError(f"{config.model_type} attention: sliding_window must be a positive int; got {window!r}.")
    return window


def hf_causal(module: nn.Module, hints: dict, window: int | None) -> bool:
    """The module's `is_causal` (the hint causal= overrides). A bidirectional sliding window (keys on
    both sides of the query) is not what Mask.window computes, so it is refused."""
    causal = hints.get("causal", bool(model_attribute(module, "is_causal", True)))
    if not causal and window is not None:
        raise AttentionError(
            f"{type(module).__name__} is bidirectional with a sliding window of {window} (keys on both sides of "
            "each query); multihead's window keeps keys up to the query only. Expected a causal layer."
        )
    return causal
