"""Converter for transformers' DeepSeek V2 / V3 / V3.2 and GLM-MoE-DSA attention -> MultiHeadLatentAttention.

Both name their weights as MultiHeadLatentAttention does (q_proj or q_a_proj / q_a_layernorm / q_b_proj,
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj), so the weights copy one to one. What the weights
do not show comes from the module and its config:

    sizes          num_heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
    scale          the module's `scaling`: qk_head_dim ** -0.5, times mscale² when rope_parameters
                   carry YaRN's mscale_all_dim (checked against `softmax_scale` below)
    rotary layout  V2 turns pairs (2k, 2k + 1) as complex numbers; V3 does the same when
                   config.rope_interleave (its default) and half-splits otherwise; V3.2 and GLM-MoE-DSA
                   always interleave. The interleaved form writes the turned key de-interleaved, a
                   fixed permutation of what we cache: every q·k, and so every output, is the same.
    indexer        V3.2 and GLM-MoE-DSA's `indexer` (wq_b, wk, k_norm, weights_proj) becomes an
                   mh.LightningIndexer with index_n_heads, index_head_dim and index_topk; it turns its
                   first qk_rope_head_dim features half-split (V3.2) or interleaved (GLM). GLM's
                   "shared" layers (config.indexer_types) have none: shared_selection=True.

The converted module is causal, like the layer inside its model, and turns q and k at positions 0 … L-1
(or after its cache).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import nn

from multihead.convert.hf.config import hf_config, hf_dropout, hf_rope
from multihead.convert.hf.decoders import _copy_rms_norm
from multihead.convert.model_attributes import model_attribute
from multihead.convert.registry import register_refusal
from multihead.errors import AttentionError
from multihead.layers.indexer import LightningIndexer
from multihead.layers.latent import MultiHeadLatentAttention
from multihead.positions import RoPE

MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "glm_moe_dsa")
SPARSE_TYPES = ("deepseek_v32", "glm_moe_dsa")  # DeepSeek Sparse Attention: a lightning indexer picks the keys
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
    """Whether `module` is a transformers DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention layer (latent keys
    and values)."""
    config = hf_config(module)
    return config is not None and config.model_type in MODEL_TYPES and \
        model_attribute(module, "kv_b_proj", None) is not None


register_refusal("DeepSeek V2/V3/V3.2 and GLM-MoE-DSA latent attention (convert it with "
                 "MultiHeadLatentAttention.from_module)", is_deepseek_attention,
                 "multi-head latent attention: every head's keys and values come from one cached latent",
                 "mh.MultiHeadLatentAttention.from_module(layer)")


def latent_from_module(module: nn.Module) -> MultiHeadLatentAttention:
    """A causal MultiHeadLatentAttention with the weights of a DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention
    layer (with its lightning indexer, if it has one)."""
    config = hf_config(module)
    if not is_deepseek_attention(module):
        got = config.model_type if config is not None else "no transformers config"
        raise AttentionError(f"MultiHeadLatentAttention.from_module expects a DeepSeek V2/V3/V3.2 or GLM-MoE-DSA "
                             f"attention layer (model_type in {list(MODEL_TYPES)}, with kv_b_proj); got "
                             f"{type(module).__name__} ({got}).")
    sizes = {name: model_attribute(module, name) for name in ("hidden_size", "num_heads", "kv_lora_rank",
             "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank", "qk_head_dim", "scaling")}
    R, scaling = sizes["qk_rope_head_dim"], sizes["scaling"]
    scale = softmax_scale(sizes["qk_head_dim"], model_attribute(config, "rope_parameters"))
    if not math.isclose(scale, scaling, rel_tol=1e-9):
        raise AttentionError(f"{type(module).__name__}.scaling is {scaling}; expected {scale} from its "
                             "head dims and rope_parameters (DeepSeek's rule).")
    interleaved = config.model_type != "deepseek_v3" or bool(model_attribute(config, "rope_interleave", True))
    weight = module.kv_b_proj.weight
    sparse = config.model_type in SPARSE_TYPES
    indexer = model_attribute(module, "indexer", None) if sparse else None
    mla = MultiHeadLatentAttention(
        sizes["hidden_size"], sizes["num_heads"], kv_lora_rank=sizes["kv_lora_rank"],
        qk_nope_head_dim=sizes["qk_nope_head_dim"], qk_rope_head_dim=R, v_head_dim=sizes["v_head_dim"],
        q_lora_rank=sizes["q_lora_rank"], bias=model_attribute(module, "o_proj").bias is not None,
        rope=hf_rope(module, config, R, whole_head=True, device=weight.device, interleaved=interleaved),
        scale=scaling, causal=True, dropout=hf_dropout(module),
        indexer=None if indexer is None else _indexer(module, indexer, config),
        shared_selection=sparse and indexer is None, device=weight.device, dtype=weight.dtype)
    _copy_weights(module, mla)
    return mla.train(module.training)


def _indexer(module: nn.Module, source: nn.Module, config) -> LightningIndexer:
    """The lightning indexer of a V3.2 / GLM-MoE-DSA layer, its weights copied."""
    R, weight = model_attribute(module, "qk_rope_head_dim"), model_attribute(source, "wk").weight
    sizes = {name: model_attribute(source, name) for name in ("softmax_scale", "head_dim", "q_lora_rank",
                                                               "num_heads", "index_topk", "k_norm")}
    D = sizes["head_dim"]
    if not math.isclose(sizes["softmax_scale"], D ** -0.5, rel_tol=1e-9):
        raise AttentionError(f"{type(source).__name__}.softmax_scale is {sizes['softmax_scale']}; expected "
                             f"index_head_dim ** -0.5 = {D ** -0.5}.")
    turn = hf_rope(module, config, R, whole_head=True, device=weight.device)  # the model's angles over R
    rope = RoPE(D, base=turn.base, interleaved=config.model_type == "glm_moe_dsa", rotary_dim=R,
                scaling=config.rope_parameters, max_position=turn.max_position, device=weight.device)
    ours = LightningIndexer(model_attribute(module, "hidden_size"), sizes["q_lora_rank"], sizes["num_heads"], D,
                            sizes["index_topk"], rope=rope, norm_eps=model_attribute(sizes["k_norm"], "eps"),
                            device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        for name in ("wq_b", "wk", "weights_proj"):
            _copy_linear(model_attribute(source, name), getattr(ours, name), f"indexer.{name}")
        ours.k_norm.load_state_dict(sizes["k_norm"].state_dict())
    return ours


def _copy_weights(source: nn.Module, target: MultiHeadLatentAttention) -> None:
    """Copy every Linear (weight and bias) and the two latent norms, checking shapes."""
    with torch.no_grad():
        for name in _WEIGHTS:
            theirs, ours = getattr(source, name, None), getattr(target, name)
            if (theirs is None) != (ours is None):
                raise AttentionError(f"{type(source).__name__}.{name} is {type(theirs).__name__}; expected it "
                                     f"{'absent' if ours is None else 'a Linear'} for its q_lora_rank.")
            if ours is not None:
                _copy_linear(theirs, ours, name)
    _copy_rms_norm(model_attribute(source, "kv_a_layernorm"), target.kv_a_layernorm, "kv_a_layernorm")
    if target.q_a_layernorm is not None:
        _copy_rms_norm(model_attribute(source, "q_a_layernorm"), target.q_a_layernorm, "q_a_layernorm")


def _copy_linear(theirs: nn.Linear, ours: nn.Linear, name: str) -> None:
    """Copy weight and bias (under no_grad), after checking that shapes and biases agree."""
    if theirs.weight.shape != ours.weight.shape or (theirs.bias is None) != (ours.bias is None):
        raise AttentionError(f"{name}: expected weight {tuple(ours.weight.shape)} (bias {ours.bias is not None}); "
                             f"got {tuple(theirs.weight.shape)} (bias {theirs.bias is not None}).")
    ours.weight.copy_(theirs.weight)
    if ours.bias is not None:
        ours.bias.copy_(theirs.bias)
