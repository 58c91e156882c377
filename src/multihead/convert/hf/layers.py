"""Converter for Hugging Face BERT-style attention (BertAttention, or its inner BertSelfAttention).

    BertAttention
      self:   BertSelfAttention   query / key / value: Linear(E, E); num_attention_heads = H
      output: BertSelfOutput      dense: Linear(E, E), then dropout, then LayerNorm(dense + input)

The converted module reproduces the attention up to and including `output.dense`: (B, L, E) in,
(B, L, E) out, batch-first. The residual and the LayerNorm after it belong to the layer, not to
attention, and are left out. Converting the inner BertSelfAttention gives the heads' concatenation
(no output projection). HF's additive `attention_mask` (B, 1, 1, L) of 0 / large negative comes from
the tokenizer's 0/1 `attention_mask`; in multihead that is `Mask.key_padding(~attention_mask.bool())`.
"""
from __future__ import annotations

from torch import nn

from multihead.convert.model_attributes import model_attribute
from multihead.convert.projections import (build_attention, check_no_extra_linears, find_dropout, linear_at,
                                           require_head_count, submodule)
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError
from multihead.layers.multi_head import MultiHeadAttention


def _check_absolute_positions(self_attention: nn.Module) -> None:
    """Relative position scores (position_embedding_type relative_key*) are not plain attention."""
    kind = model_attribute(self_attention, "position_embedding_type", None)
    kind = kind or model_attribute(model_attribute(self_attention, "config", None), "position_embedding_type", None)
    if kind not in (None, "absolute"):
        raise AttentionError(
            f"this BERT attention adds relative position scores (position_embedding_type={kind!r}), "
            "which multihead's MultiHeadAttention does not compute; only 'absolute' converts."
        )


@register_converter("Hugging Face BERT (self.query/key/value + output.dense)")
def convert_bert_attention(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """BertAttention -> attention up to output.dense; BertSelfAttention -> heads concatenated."""
    inner, out = submodule(module, "self"), linear_at(module, "output.dense")
    if inner is None or out is None:
        inner, out = module, None  # perhaps the inner BertSelfAttention itself
    q, k, v = (linear_at(inner, name) for name in ("query", "key", "value"))
    if q is None or k is None or v is None:
        return None
    check_no_extra_linears(module, (q, k, v, out), "Hugging Face BERT attention")
    _check_absolute_positions(inner)
    num_heads = require_head_count(module, hints, "Hugging Face BERT attention", inner)
    return build_attention(q, k, v, out, num_heads, batch_first=hints.get("batch_first", True),
                           dropout=find_dropout(inner, "dropout"), causal=hints.get("causal", False),
                           training=module.training)
