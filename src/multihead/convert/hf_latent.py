"""Converter for transformers' DeepseekV2Attention and DeepseekV3Attention -> MultiHeadLatentAttention.

Both name their weights as MultiHeadLatentAttention does (q_proj or q_a_proj / q_a_layernorm / q_b_proj,
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj), so the weights copy one to one. What the weights
do not show comes from the module and its config:

    sizes          num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    scale          the module's `scaling`: qk_head_dim ** -0.5, times mscale² when rope_parameters
                   carry YaRN's mscale_all_dim (checked against `softmax_scale` below)
    rotary layout  V2 turns pairs (2k, 2k + 1) as complex numbers; V3 does the same when
                   config.rope_interleave (its default) and half-splits otherwise. V3's interleaved
                   form writes the turned key de-interleaved, a fixed permutation of what we cache:
                   every q·k, and so every output, is the same.

The converted module is causal, like the layer inside its model, and turns q and k at positions 0 … L-1
(or after its cache).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from multihead.convert.hf_config import hf_config, hf_dropout, hf_rope
from multihead.convert.hf_decoders import _copy_rms_norm
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError
from multihead.latent import MultiHeadLatentAttention

MODEL_TYPES = ("deepseek_v2", "deepseek_v3")
_WEIGHTS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")


def softmax_scale(qk_head_dim: int, rope_parameters: Mapping | None) -> float:
    """DeepSeek's factor on q·k: qk_head_dim ** -0.5, times mscale² for scaled RoPE with mscale_all_dim,
    mscale = 0.1 · mscale_all_dim · ln(factor) + 1 (1 when factor <= 1)."""
    scale = qk_head_dim ** -0.5
    params = rope_parameters or {}
    if params.get("rope_type", "default") != "default" and params.get("mscale_all_dim"):
        factor = float(params["factor"])
        mscale = 1.0 if factor <= 1 else 0.1 * float(params["mscale_all_dim"]) * math.log(factor) + 1.0
        scale *= mscale * mscale
    return scale


def is_deepseek_attention(module: nn.Module) -> bool:
    """Whether `module` is a transformers DeepSeek V2/V3 attention layer (latent keys and values)."""
    config = hf_config(module)
    return config is not None and config.model_type in MODEL_TYPES and getattr(module, "kv_b_proj", None) is not None


@register_converter("DeepSeek V2/V3 latent attention (convert it with MultiHeadLatentAttention.from_module)")
def refuse_latent_attention(module: nn.Module, **hints) -> None:
    """MultiHeadAttention.from_module on a DeepSeek layer: say which class converts it."""
    if is_deepseek_attention(module):
        raise AttentionError(f"{type(module).__name__} is multi-head latent attention: every head's keys and values "
                             "come from one cached latent, which MultiHeadAttention cannot hold. Convert it with "
                             "mh.MultiHeadLatentAttention.from_module(layer).")
    return None


def latent_from_module(module: nn.Module) -> MultiHeadLatentAttention:
    """A causal MultiHeadLatentAttention with the weights of a DeepSeek V2/V3 attention layer."""
    config = hf_config(module)
    if not is_deepseek_attention(module):
        got = config.model_type if config is not None else "no transformers config"
        raise AttentionError(f"MultiHeadLatentAttention.from_module expects a DeepSeek V2/V3 attention layer "
                             f"(model_type in {list(MODEL_TYPES)}, with kv_b_proj); got {type(module).__name__} "
                             f"({got}).")
    R = module.qk_rope_head_dim
    scale = softmax_scale(module.qk_head_dim, config.rope_parameters)
    if not math.isclose(scale, module.scaling, rel_tol=1e-9):
        raise AttentionError(f"{type(module).__name__}.scaling is {module.scaling}; expected {scale} from its "
                             "head dims and rope_parameters (DeepSeek's rule).")
    interleaved = config.model_type == "deepseek_v2" or bool(getattr(config, "rope_interleave", True))
    weight = module.kv_b_proj.weight
    mla = MultiHeadLatentAttention(
        module.hidden_size, module.num_heads, kv_lora_rank=module.kv_lora_rank,
        qk_nope_head_dim=module.qk_nope_head_dim, qk_rope_head_dim=R, v_head_dim=module.v_head_dim,
        q_lora_rank=module.q_lora_rank, bias=module.o_proj.bias is not None,
        rope=hf_rope(module, config, R, whole_head=True, device=weight.device, interleaved=interleaved),
        scale=module.scaling, causal=True, dropout=hf_dropout(module), device=weight.device, dtype=weight.dtype)
    _copy_weights(module, mla)
    return mla.train(module.training)


def _copy_weights(source: nn.Module, target: MultiHeadLatentAttention) -> None:
    """Copy every Linear (weight and bias) and the two latent norms, checking shapes."""
    with torch.no_grad():
        for name in _WEIGHTS:
            theirs, ours = getattr(source, name, None), getattr(target, name)
            if (theirs is None) != (ours is None):
                raise AttentionError(f"{type(source).__name__}.{name} is {type(theirs).__name__}; expected it "
                                     f"{'absent' if ours is None else 'a Linear'} for its q_lora_rank.")
            if ours is None:
                continue
            if theirs.weight.shape != ours.weight.shape or (theirs.bias is None) != (ours.bias is None):
                raise AttentionError(f"{name}: expected weight {tuple(ours.weight.shape)} "
                                     f"(bias {ours.bias is not None}); got {tuple(theirs.weight.shape)} "
                                     f"(bias {theirs.bias is not None}).")
            ours.weight.copy_(theirs.weight)
            if ours.bias is not None:
                ours.bias.copy_(theirs.bias)
    _copy_rms_norm(source.kv_a_layernorm, target.kv_a_layernorm, "kv_a_layernorm")
    if target.q_a_layernorm is not None:
        _copy_rms_norm(source.q_a_layernorm, target.q_a_layernorm, "q_a_layernorm")
