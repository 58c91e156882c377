"""Converter for Hugging Face decoder attention with q_proj / k_proj / v_proj / o_proj: Llama, Mistral,
Qwen2, Qwen3, Qwen3-Next's full-attention layers, Gemma 2, Gemma 3, DiffLlama and Llama 4's text
layers (the module at `model.layers[i].self_attn`); and Phi-3, whose one qkv_proj holds q, k and v
(cut as its forward cuts it: hf_fused_qkv).

Every one of them computes, for hidden states x (B, L, E):

    q = q_proj(x) -> (B, H, L, D)      k, v = k_proj(x), v_proj(x) -> (B, Hkv, L, D)     (GQA: Hkv <= H)
    q, k = q_norm(q), k_norm(k)        Qwen3, Gemma 3: RMSNorm over each head's D features, before RoPE
    q, k = RoPE(q, k, position_ids)    half-split layout (rotate_half), all D features turn
    scores = q k^T * scaling           scaling = D ** -0.5; Gemma 2: query_pre_attn_scalar ** -0.5
    scores = c * tanh(scores / c)      Gemma 2 only: c = attn_logit_softcapping
    causal mask, and on sliding layers keys j > i - sliding_window; then softmax, @ v, o_proj

and maps one to one onto MultiHeadAttention(causal=True, rope=RoPE(...), num_kv_heads=Hkv, window=,
softcap=, scale=, qk_norm=):

    model_type  biases (q, k, v / o)       window                           extra
    llama       config.attention_bias      none                             rope scaling: linear, dynamic, llama3
    mistral     none                       config.sliding_window, all layers
    qwen2       q, k, v yes / o no         module.sliding_window: layers    (config.layer_types)
                                           at or past max_window_layers
    qwen3       config.attention_bias      as qwen2                         qk_norm (q_norm / k_norm weights, eps)
    gemma2      config.attention_bias      module.sliding_window: every     scale, softcap
                                           other layer (layer_types)
    gemma3_text config.attention_bias      module.sliding_window: the       scale, qk_norm scaled by
                                           sliding layers (layer_types)     (1 + weight), a RoPE base
                                                                            per layer type
    qwen3_next  config.attention_bias      none                             output gate (q_proj's rows
                                                                            are [query | gate] per head),
                                                                            qk_norm scaled by (1 + weight),
                                                                            partial rotary
    diffllama   config.attention_bias      none                             differential head pairs
                                                                            (hf_variants)
    llama4_text config.attention_bias      chunks on the RoPE layers        interleaved RoPE or none
                                           (attention_chunk_size)           (NoPE layers, with query
                                                                            temperature), weightless
                                                                            qk norm (hf_variants)
    phi3        none                       config.sliding_window, all       fused qkv_proj, partial rotary,
                                           layers                           LongRoPE

The rotary embedding lives in the model (its cos/sin reach each layer as `position_embeddings`); the
converted module rebuilds it from config.rope_parameters and config.max_position_embeddings, and
turns q and k at `positions=` (default 0 .. L-1, or after the cache). What stays outside attention
is left out: the layer's norms, residual and MLP, Gemma 2's embedding scale and final logit softcap.
Padding is the caller's mask: HF's 0/1 `attention_mask` is `Mask.key_padding(attention_mask == 0)`.
Other model types that also name their projections q_proj ... o_proj (Cohere's interleaved RoPE, ...)
differ in ways the weights do not show, so they are refused.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.convert.hf.config import hf_causal, hf_config, hf_dropout, hf_rope, hf_scale, hf_window
from multihead.convert.hf.fused_qkv import fused_qkv
from multihead.convert.hf.variants import decoder_variant
from multihead.convert.model_attributes import model_attribute
from multihead.convert.projections import build_attention, check_no_extra_linears, linear_at, require_head_count
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError, shape_str
from multihead.layers.multi_head import MultiHeadAttention

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "qwen3_next", "gemma2", "gemma3_text", "diffllama",
               "llama4_text", "phi3")
NORM_OFFSET = {"gemma3_text": 1.0, "qwen3_next": 1.0}  # q/k norms scaling by (offset + weight); 0 elsewhere
PARTIAL_ROTARY = ("qwen3_next", "phi3")  # RoPE turns the first int(D * partial_rotary_factor) features
FUSED_QKV = ("phi3",)  # one qkv_proj in place of q_proj, k_proj, v_proj
STYLE = "Hugging Face decoder attention (q_proj/k_proj/v_proj/o_proj: " + ", ".join(MODEL_TYPES) + ")"


@register_converter(STYLE)
def convert_hf_decoder_attention(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """LlamaAttention and its cousins -> a causal MultiHeadAttention with RoPE and the layer's variants."""
    q, k, v, o = (linear_at(module, name) for name in ("q_proj", "k_proj", "v_proj", "o_proj"))
    qkv, config = linear_at(module, "qkv_proj"), hf_config(module)
    fused = q is None and k is None and v is None and qkv is not None
    if not (fused or (q is not None and k is not None and v is not None)) or o is None or config is None:
        return None
    if config.model_type not in MODEL_TYPES or fused != (config.model_type in FUSED_QKV):
        raise AttentionError(
            f"{type(module).__name__} comes from a Hugging Face {config.model_type!r} model; expected one of "
            f"{list(MODEL_TYPES)}, whose rotary layout, norms and scaling are known. Others may differ where "
            "the weights do not show it; pass the projections explicitly if you know it is plain attention."
        )
    check_no_extra_linears(module, (qkv, o) if fused else (q, k, v, o), STYLE)
    num_heads = require_head_count(module, hints, STYLE)
    whole_head, rope = config.model_type not in PARTIAL_ROTARY, None
    if fused:  # the rows of q, k and v are where the layer's forward cuts qkv_proj's output
        head_dim = model_attribute(module, "head_dim", None) or model_attribute(config, "hidden_size") // num_heads
        rope = hf_rope(module, config, head_dim, whole_head=whole_head, device=o.weight.device)
        q, k, v = fused_qkv(module, qkv, num_heads, model_attribute(config, "num_key_value_heads"), head_dim,
                            rope.rotary_dim)
    variant = decoder_variant(module, config, q, num_heads)
    head_dim = variant.query_rows // num_heads
    window = hf_window(module, config)
    rope = rope or hf_rope(module, config, head_dim, whole_head=whole_head, device=o.weight.device)
    options = dict(rope=rope,
                   window=window, softcap=model_attribute(module, "attn_logit_softcapping", None),
                   scale=hf_scale(module, head_dim), qk_norm=_has_qk_norm(module))
    options.update(variant.options)  # what the family sets its own way
    mod = build_attention(variant.query, k, v, o, num_heads, module_class=variant.module_class,
                          batch_first=hints.get("batch_first", True), dropout=hf_dropout(module),
                          causal=hf_causal(module, hints, window), training=module.training, **options)
    if _has_qk_norm(module):
        offset = NORM_OFFSET.get(config.model_type, 0.0)
        _copy_rms_norm(module.q_norm, mod.q_norm, "q_norm", offset)
        _copy_rms_norm(module.k_norm, mod.k_norm, "k_norm", offset)
    variant.finish(mod)
    return mod


def _has_qk_norm(module: nn.Module) -> bool:
    """True when the module normalises q and k per head (Qwen3); both or neither must be there."""
    found = [model_attribute(module, name, None) is not None for name in ("q_norm", "k_norm")]
    if found[0] != found[1]:
        raise AttentionError(f"{type(module).__name__} has only one of q_norm / k_norm; expected both or neither.")
    return found[0]


def _copy_rms_norm(source: nn.Module, target: nn.RMSNorm, name: str, offset: float = 0.0) -> None:
    """Copy weight (+ offset) and eps of an HF RMSNorm over D into `target`, after checking on a probe
    input that `source` computes x / sqrt(mean(x^2) + eps) * (offset + weight), as `target` then does."""
    weight = getattr(source, "weight", None)
    D = target.normalized_shape[0]
    if not isinstance(weight, torch.Tensor) or tuple(weight.shape) != (D,):
        got = shape_str(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise AttentionError(f"{name} must be an RMSNorm over the head dim: weight ({D},) and a float eps; "
                             f"got weight {got}.")
    eps = model_attribute(source, "eps", types=(float,))
    with torch.no_grad():
        target.weight.copy_(weight + offset)
        target.eps = eps
        probe = torch.randn(3, D, generator=torch.Generator().manual_seed(0)).to(weight)
        loose = weight.dtype in (torch.bfloat16, torch.float16)  # the two norms round differently there
        same = torch.allclose(source(probe), target(probe), rtol=2e-2 if loose else 1e-4, atol=2e-2 if loose else 1e-5)
    if not same:
        raise AttentionError(
            f"{name} ({type(source).__name__}) does not compute x / sqrt(mean(x^2) + eps) * ({offset} + weight) over "
            "each head; multihead's qk_norm is that RMSNorm."
        )
