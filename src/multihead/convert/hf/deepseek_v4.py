"""Converter for transformers' DeepseekV4Attention (all three layer types) -> mh.SharedKVAttention.

The weights keep their names, except inside the compressed-sparse layer's compressor, where
transformers nests the indexer (`compressor.indexer.*`; its head weights in `scorer.weights_proj`) and
multihead keeps it beside the compressor (`indexer.compressor.*`, `indexer.q_b_proj`,
`indexer.weights_proj`). What the weights do not show comes from the config:

    layer type     config.layer_types[layer_idx]: sliding_attention, compressed_sparse_attention (CSA,
                   with an indexer) or heavily_compressed_attention (HCA); the rate from compress_rates
    rotary         config.rope_parameters["main"] for sliding layers, ["compress"] for CSA / HCA (their
                   compressors and indexer too): qk_rope_head_dim trailing features, interleaved pairs
    sizes          head_dim, q_lora_rank, sliding_window, o_groups, o_lora_rank, index_n_heads,
                   index_head_dim, index_topk, rms_norm_eps (every norm)

The converted layer turns q and k at positions 0 … L-1 (or after its cache), as the layer inside its
model does when it reads the model's first tokens.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from multihead.convert.hf.config import hf_config, hf_dropout
from multihead.convert.model_attributes import model_attribute
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError
from multihead.positions import RoPE
from multihead.layers.shared_kv import SharedKVAttention

MODEL_TYPE = "deepseek_v4"
_RENAMED = (("compressor.indexer.scorer.weights_proj.", "indexer.weights_proj."),
            ("compressor.indexer.q_b_proj.", "indexer.q_b_proj."),
            ("compressor.indexer.", "indexer.compressor."))


def is_deepseek_v4_attention(module: nn.Module) -> bool:
    """Whether `module` is a transformers DeepSeek V4 attention layer."""
    config = hf_config(module)
    return config is not None and config.model_type == MODEL_TYPE and \
        all(model_attribute(module, name, None) is not None for name in ("kv_proj", "o_a_proj"))


@register_converter("DeepSeek V4 shared-KV attention (the variant's own class, mh.SharedKVAttention)")
def _v4_layer(module: nn.Module, **hints) -> SharedKVAttention | None:
    """MultiHeadAttention.from_module on a V4 layer gives its variant's own class, as for gated and
    differential attention: one K = V head, compressed blocks and a grouped output projection."""
    return shared_kv_from_module(module) if is_deepseek_v4_attention(module) else None


def shared_kv_from_module(module: nn.Module) -> SharedKVAttention:
    """A SharedKVAttention with the weights of a transformers DeepseekV4Attention layer."""
    config = hf_config(module)
    if not is_deepseek_v4_attention(module):
        got = config.model_type if config is not None else "no transformers config"
        raise AttentionError(f"SharedKVAttention.from_module expects a DeepSeek V4 attention layer (model_type "
                             f"{MODEL_TYPE!r}); got {type(module).__name__} ({got}).")
    layer_idx = model_attribute(module, "layer_idx")
    layer_type = model_attribute(config, "layer_types")[layer_idx]
    D, scaling, weight = model_attribute(module, "head_dim"), model_attribute(module, "scaling"), module.kv_proj.weight
    if not math.isclose(scaling, D ** -0.5, rel_tol=1e-9):
        raise AttentionError(f"{type(module).__name__}.scaling is {scaling}; expected head_dim ** -0.5.")
    sparse = layer_type == "compressed_sparse_attention"
    index = {"index_heads": model_attribute(config, "index_n_heads"),
             "index_head_dim": model_attribute(config, "index_head_dim"),
             "index_topk": model_attribute(config, "index_topk")} if sparse else {}
    sizes = {name: model_attribute(config, name) for name in ("hidden_size", "q_lora_rank", "o_groups", "o_lora_rank",
                                                               "rms_norm_eps")}
    ours = SharedKVAttention(
        sizes["hidden_size"], model_attribute(module, "num_heads"), D, q_lora_rank=sizes["q_lora_rank"],
        rope=_rope(config, layer_type, weight), window=model_attribute(module, "sliding_window"),
        o_groups=sizes["o_groups"], o_lora_rank=sizes["o_lora_rank"],
        compress_rate=None if layer_type == "sliding_attention" else
        model_attribute(config, "compress_rates")[layer_type],
        norm_eps=sizes["rms_norm_eps"], dropout=hf_dropout(module), device=weight.device, dtype=weight.dtype, **index)
    state = {_our_name(name): t for name, t in module.state_dict().items()}
    try:
        with torch.no_grad():
            ours.load_state_dict(state, strict=True)
    except RuntimeError as error:
        raise AttentionError(f"{type(module).__name__} (layer {layer_idx}, {layer_type}) does not fit its "
                             f"config's sizes: {error}") from None
    return ours.train(module.training)


def _our_name(name: str) -> str:
    for theirs, ours in _RENAMED:
        if name.startswith(theirs):
            return ours + name[len(theirs):]
    return name


def _rope(config, layer_type: str, weight: torch.Tensor) -> RoPE:
    """The layer's rotary embedding over its qk_rope_head_dim trailing features, as an mh.RoPE."""
    kind = "main" if layer_type == "sliding_attention" else "compress"
    params = dict(model_attribute(config, "rope_parameters")[kind])
    params.pop("partial_rotary_factor", None)  # the RoPE below spans the rotary features alone
    try:
        return RoPE(model_attribute(config, "qk_rope_head_dim"), base=float(params["rope_theta"]), interleaved=True,
                    scaling=params, max_position=model_attribute(config, "max_position_embeddings"),
                    device=weight.device)
    except AttentionError as error:
        raise AttentionError(f"deepseek_v4 rope_parameters {params}: {error}") from None
