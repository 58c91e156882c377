"""The "multihead" AttentionInterface entry: Hugging Face attention modules call it like their "sdpa" one.

    attn_output, attn_weights = hf_attention(module, query, key, value, attention_mask, dropout=...,
                                             scaling=..., softcap=..., sliding_window=..., s_aux=...)
    query (B, H, Lq, D), key/value (B, Hkv, Lk, D)  ->  attn_output (B, Lq, H, D), weights (B, H, Lq, Lk) or None

What reaches mh.attention: the Mask that `hf_mask` built (causal, sliding window, padding), the
module's `scaling`, `softcap` (Gemma 2's attn_logit_softcapping), sink logits (gpt-oss: the `s_aux`
argument or `module.sinks`), the keys a sparse-attention indexer selected (DeepSeek V3.2, GLM-MoE-DSA:
`indices` (B, Lq, K), which HF folds into the mask only for its own eager and sdpa attention) and the
dropout. Key/value heads stay grouped (no repeat_kv).

The mask arrives in one of three forms:
- a Mask from `hf_mask`: the whole truth, used as is;
- a tensor (a 4-D mask the caller prepared; HF passes those through untouched): bool True = attend
  (HF's sdpa convention) or float added to the scores (HF's eager convention);
- None: transformers built no mask. If this function is registered without its mask function, HF
  skips mask creation for the whole model (padding included), so that case raises; otherwise the
  module's own `is_causal` (and `sliding_window`) decide, bottom-right aligned for decoding.

key and value may also be a quantized cache's codes and scales (`Quantized`, from hf/quantized.py's
cache layer): mh.attention reads them (dispatch's quantized backend), which mh.trace() shows as
backend "quantized".

With output_attentions=True the weights are computed on the reference path and the output from
them, as HF's eager attention does; otherwise the fastest exact backend runs.
"""
from __future__ import annotations

from typing import Any

import torch
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

from multihead.attention import attention
from multihead.backends.with_weights import attention_with_weights
from multihead.errors import AttentionError, shape_str
from multihead.masks import Mask

NAME = "multihead"  # the name registered in transformers' AttentionInterface and AttentionMaskInterface

_active_collector: Any
try:  # where transformers keeps the requested outputs (output_attentions=True lands here)
    from transformers.utils.output_capturing import _active_collector
except ImportError:  # older transformers pass output_attentions to the attention function instead
    _active_collector = None


def hf_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                 attention_mask, dropout: float = 0.0, scaling: float | None = None, is_causal: bool | None = None,
                 softcap: float | None = None, sliding_window: int | None = None, s_aux: torch.Tensor | None = None,
                 **kwargs) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(attn_output (B, Lq, H, D), attn_weights (B, H, Lq, Lk) or None); see the module docstring."""
    for unsupported in ("position_bias", "cache"):
        if kwargs.get(unsupported) is not None:
            raise AttentionError(f"the 'multihead' attention does not take {unsupported}= (a T5-style bias or a "
                                 "paged cache); use attn_implementation='sdpa' or 'eager' for this model.")
    mask = as_mask(module, attention_mask, is_causal, sliding_window)
    indices = kwargs.pop("indices", None)
    if indices is not None:
        mask = Mask.sparse(indices) if mask is None else mask & Mask.sparse(indices)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    weights = None
    if weights_requested(kwargs):
        if not isinstance(key, torch.Tensor):  # a quantized cache's codes: dispatch reads them, weights are not made
            raise AttentionError("attention weights are not computed over a quantized cache; generate with a float "
                                 "cache for output_attentions=True.")
        out, weights = attention_with_weights(query, key, value, mask, scale=scaling, softcap=softcap, sinks=sinks,
                                              dropout=float(dropout))  # (B, H, Lq, D), (B, H, Lq, Lk)
        weights = weights.to(query.dtype)
    else:
        out = attention(query, key, value, mask, scale=scaling, softcap=softcap, sinks=sinks, dropout=float(dropout))
    return out.transpose(1, 2).contiguous(), weights


def as_mask(module, attention_mask, is_causal: bool | None, sliding_window: int | None) -> Mask | None:
    """The Mask this call attends under; see the module docstring for the three forms."""
    if isinstance(attention_mask, Mask):
        return attention_mask
    if isinstance(attention_mask, torch.Tensor):
        if attention_mask.dim() != 4:
            raise AttentionError(f"attention_mask must be a 4-D (B, 1 or H, Lq, Lk) mask here; got shape "
                                 f"{shape_str(attention_mask.shape)}. Let the model build it from the 2-D mask.")
        if attention_mask.dtype == torch.bool:
            return Mask.keep(attention_mask)
        return Mask.additive(attention_mask)
    if attention_mask is not None:
        raise AttentionError(f"attention_mask must be a multihead Mask, a 4-D tensor or None; got "
                             f"{type(attention_mask).__name__} (is the model set to another attention?).")
    _check_mask_function_registered(module)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)  # as HF's sdpa
    if not causal:
        return None
    mask = Mask.causal("bottom_right")  # the last query sits at the last key: right for prefill and decoding
    return mask if not sliding_window else mask & Mask.window(int(sliding_window), "bottom_right")


def _check_mask_function_registered(module) -> None:
    """No mask at all while the model's implementation has no mask function: padding would be lost."""
    name = getattr(getattr(module, "config", None), "_attn_implementation", None)
    if name is not None and name not in ALL_MASK_ATTENTION_FUNCTIONS:
        raise AttentionError(
            f"attn_implementation={name!r} has an attention function but no mask function, so transformers "
            "builds no mask at all (no causal mask, no padding). Register both with "
            f"multihead.hf.register({name!r}).")


def weights_requested(kwargs: dict) -> bool:
    """Whether the caller asked for attention weights (output_attentions=True, by argument or config)."""
    if kwargs.get("output_attentions"):
        return True
    if _active_collector is None:
        return False
    if torch.compiler.is_compiling():  # dynamo cannot trace ContextVar.get; HF keeps a plain global then
        collected = getattr(_active_collector, "global_var", None)
    else:
        collected = _active_collector.get()
    return isinstance(collected, dict) and "attentions" in collected
