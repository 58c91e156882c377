"""The decoder variants whose layers add weights to Llama's four projections: an output gate
(Qwen3-Next) and differential attention (DiffLlama), and the ones whose positions and masks differ per layer (Llama 4). Each one names the class to build, its extra
arguments, and how to copy its own weights; convert/hf_decoders reads everything else.

    qwen3_next  q_proj (H*2D, E), rows per head [query D | gate D]  -> q_proj + gate_proj of
                                                                       mh.GatedMultiHeadAttention
    diffllama   lambda_q1, lambda_k1, lambda_q2, lambda_k2 (D,),     -> mh.DifferentialAttention
                lambda_init, groupnorm (RMSNorm over 2D, no weight)
    llama4_text RoPE layers (no_rope_layers[i] = 1): interleaved    -> rope=RoPE(interleaved=True),
                RoPE, a weightless L2 norm of q and k, chunks of       qk_norm (weight 1), chunk_size
                attention_chunk_size positions (layer_types)
                NoPE layers: no RoPE, queries scaled by position      -> temperature=QueryTemperature
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from multihead.convert.hf.config import hf_rope
from multihead.layers.differential import DifferentialAttention
from multihead.convert.model_attributes import model_attribute
from multihead.errors import AttentionError
from multihead.layers.gated import GatedMultiHeadAttention
from multihead.layers.multi_head import MultiHeadAttention
from multihead.positions import QueryTemperature


@dataclass
class Variant:
    """What a model type's layer needs beyond q/k/v/o: the query weights to copy, the class, its arguments,
    and a step that copies the variant's own weights into the built module."""

    query: object  # nn.Linear or (weight, bias): what becomes q_proj
    module_class: type[MultiHeadAttention] = MultiHeadAttention
    options: dict = field(default_factory=dict)
    finish: Callable[[MultiHeadAttention], None] = lambda mod: None

    @property
    def query_rows(self) -> int:
        """H*D: the rows of the query weights that become q_proj."""
        return self.query[0].shape[0] if isinstance(self.query, tuple) else self.query.out_features


def decoder_variant(module: nn.Module, config, q: nn.Linear, num_heads: int) -> Variant:
    """The Variant of `module` (a layer of a model with this transformers `config`); plain attention for others."""
    if config.model_type == "qwen3_next":
        return _gated(q, num_heads)
    if config.model_type == "diffllama":
        return _differential(module, q)
    if config.model_type == "llama4_text":
        return _llama4(module, config, q, q.out_features // num_heads)
    return Variant(q)


def _gated(q: nn.Linear, num_heads: int) -> Variant:
    """Qwen3-Next: q_proj's rows per head are [query D | gate D]; split them into q_proj and gate_proj."""
    rows, E = q.weight.shape
    if rows % (2 * num_heads):
        raise AttentionError(f"a gated q_proj has 2 x H x D rows; got {rows} rows for H={num_heads}.")
    D = rows // (2 * num_heads)
    weight = q.weight.detach().view(num_heads, 2, D, E)  # (H, query|gate, D, E)
    bias = None if q.bias is None else q.bias.detach().view(num_heads, 2, D)

    def rows_of(i: int):  # the query (0) or gate (1) rows of every head: (H*D, E) and (H*D,)
        return weight[:, i].reshape(num_heads * D, E), None if bias is None else bias[:, i].reshape(num_heads * D)

    def copy_gate(mod: MultiHeadAttention) -> None:
        gate_weight, gate_bias = rows_of(1)
        with torch.no_grad():
            mod.gate_proj.weight.copy_(gate_weight)
            if gate_bias is not None:
                mod.gate_proj.bias.copy_(gate_bias)

    return Variant(rows_of(0), GatedMultiHeadAttention, finish=copy_gate)


def _differential(module: nn.Module, q: nn.Linear) -> Variant:
    """DiffLlama: λ's four vectors, λ_init of this layer and the pair norm's epsilon."""
    norm = model_attribute(module, "groupnorm", None)
    if not isinstance(norm, nn.RMSNorm) or norm.weight is not None:
        raise AttentionError(f"{type(module).__name__}.groupnorm should be an nn.RMSNorm without weight over 2D; "
                             f"got {type(norm).__name__}.")

    lambdas = {name: model_attribute(module, name) for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")}

    def copy_lambdas(mod: MultiHeadAttention) -> None:
        with torch.no_grad():
            for name, value in lambdas.items():
                getattr(mod, name).copy_(value)

    options = {"lambda_init": float(model_attribute(module, "lambda_init", types=(int, float))),
               "norm_eps": model_attribute(norm, "eps")}
    return Variant(q, DifferentialAttention, options, copy_lambdas)


def _llama4(module: nn.Module, config, q: nn.Linear, head_dim: int) -> Variant:
    """Llama 4's text layers: RoPE + L2-normed q, k + chunks, or NoPE + query temperature."""
    uses_rope = bool(model_attribute(module, "use_rope"))
    layer_type = model_attribute(config, "layer_types")[model_attribute(module, "layer_idx")]
    norm = model_attribute(module, "qk_norm", None)
    eps = None if norm is None else model_attribute(norm, "eps", types=(float,))  # before anything is built
    options = {
        "rope": hf_rope(module, config, head_dim, whole_head=True, interleaved=True, device=q.weight.device)
        if uses_rope else None,
        "qk_norm": norm is not None,
        "chunk_size": model_attribute(config, "attention_chunk_size") if layer_type == "chunked_attention" else None,
        "temperature": QueryTemperature(model_attribute(config, "floor_scale"), model_attribute(config, "attn_scale"))
        if model_attribute(module, "attn_temperature_tuning") and not uses_rope else None,
    }

    def copy_norm(mod: MultiHeadAttention) -> None:  # Llama 4 normalises after RoPE: the same, a turn keeps lengths
        if norm is not None:
            for target in (mod.q_norm, mod.k_norm):
                nn.init.ones_(target.weight)
                target.eps = eps

    return Variant(q, options=options, finish=copy_norm)
