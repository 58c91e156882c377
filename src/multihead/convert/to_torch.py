"""The way back: a MultiHeadAttention -> torch.nn.MultiheadAttention with the same outputs.

nn.MultiheadAttention can hold the same maths when every head reads the same keys and values (no
GQA), the heads fill the embedding exactly (H * D == E), the output has E features, and the module is
not causal by construction (nn.MultiheadAttention takes its causal mask per call). Its biases
are all-or-nothing (in_proj_bias (3E,) and out_proj.bias (E,)): a projection of ours without a bias
gets a zero bias there, which computes the same (and is trainable from then on).

Weight layout: with kdim == vdim == E it packs q, k, v into in_proj_weight (3E, E), query rows first;
otherwise it keeps q_proj_weight (E, E), k_proj_weight (E, kdim), v_proj_weight (E, vdim).
Masks: our Mask.key_padding(pad) is its key_padding_mask=pad; Mask.block(m) is its attn_mask=m.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.errors import AttentionError
from multihead.layers.multi_head import MultiHeadAttention


def _unsupported_reasons(mod: MultiHeadAttention) -> list[str]:
    """Why nn.MultiheadAttention cannot hold `mod`; empty when it can."""
    reasons = []
    if mod.num_kv_heads != mod.num_heads:
        reasons.append(f"it shares key/value heads (num_kv_heads={mod.num_kv_heads} < num_heads={mod.num_heads}, GQA)")
    if mod.num_heads * mod.head_dim != mod.embed_dim:
        reasons.append(
            f"its heads are {mod.num_heads} x {mod.head_dim} = {mod.num_heads * mod.head_dim} wide, "
            f"not embed_dim={mod.embed_dim}"
        )
    if mod.out_dim != mod.embed_dim:
        reasons.append(f"its output has out_dim={mod.out_dim} features, not embed_dim={mod.embed_dim}")
    if getattr(mod, "causal", False):
        reasons.append(
            "it is causal on every call, which nn.MultiheadAttention cannot remember (set mod.causal = False "
            "first, then pass attn_mask=nn.Transformer.generate_square_subsequent_mask(L) on each call)"
        )
    variants = [name for name, on in (
        ("rope", mod.rope is not None), ("window", mod.window is not None),
        ("chunks", getattr(mod, "chunk_size", None) is not None),
        ("query temperature", getattr(mod, "temperature", None) is not None),
        ("alibi", mod.alibi_slopes is not None), ("softcap", mod.softcap is not None),
        ("sinks", mod.sinks is not None), ("qk_norm", mod.q_norm is not None),
        ("scale", getattr(mod, "scale", None) is not None),
        ("an output gate", getattr(mod, "gate_proj", None) is not None),
        ("differential head pairs", getattr(mod, "lambda_q1", None) is not None)) if on]
    if variants:
        reasons.append(f"it uses {', '.join(variants)}, which nn.MultiheadAttention does not compute")
    return reasons


def _bias_or_zeros(proj: nn.Linear) -> torch.Tensor:
    """proj's bias (out,), or zeros of that shape when it has none."""
    if proj.bias is not None:
        return proj.bias
    return torch.zeros(proj.out_features, dtype=proj.weight.dtype, device=proj.weight.device)


def to_torch(mod: MultiHeadAttention) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention computing what `mod` computes: same layout, weights copied, same mode.

    query (B, Lq, E) -> (B, Lq, E) (or seq-first, as mod.batch_first says). Raises AttentionError,
    saying why, when nn.MultiheadAttention has no place for mod's configuration.
    """
    if not isinstance(mod, MultiHeadAttention):
        raise AttentionError(f"to_torch expects a multihead.MultiHeadAttention; got {type(mod).__name__}.")
    reasons = _unsupported_reasons(mod)
    if reasons:
        raise AttentionError(
            "torch.nn.MultiheadAttention cannot hold this module: " + "; ".join(reasons) + ". "
            "Keep using multihead.MultiHeadAttention for it."
        )
    projections = (mod.q_proj, mod.k_proj, mod.v_proj, mod.out_proj)
    has_bias = any(proj.bias is not None for proj in projections)
    weight = mod.q_proj.weight
    torch_mha = nn.MultiheadAttention(
        mod.embed_dim, mod.num_heads, dropout=mod.dropout, bias=has_bias, kdim=mod.kdim, vdim=mod.vdim,
        batch_first=mod.batch_first, device=weight.device, dtype=weight.dtype,
    )
    with torch.no_grad():
        if torch_mha._qkv_same_embed_dim:
            torch_mha.in_proj_weight.copy_(torch.cat([mod.q_proj.weight, mod.k_proj.weight, mod.v_proj.weight]))
        else:
            torch_mha.q_proj_weight.copy_(mod.q_proj.weight)
            torch_mha.k_proj_weight.copy_(mod.k_proj.weight)
            torch_mha.v_proj_weight.copy_(mod.v_proj.weight)
        torch_mha.out_proj.weight.copy_(mod.out_proj.weight)
        if has_bias:
            torch_mha.in_proj_bias.copy_(torch.cat([_bias_or_zeros(p) for p in projections[:3]]))  # (3E,)
            torch_mha.out_proj.bias.copy_(_bias_or_zeros(mod.out_proj))
    return torch_mha.train(mod.training)
