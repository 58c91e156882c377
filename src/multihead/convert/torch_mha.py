"""torch.nn.MultiheadAttention -> MultiHeadAttention (packed or separate in-projections)."""
from __future__ import annotations

from torch import nn

from multihead.convert.registry import linears_to_module, register_converter
from multihead.errors import AttentionError


@register_converter("torch.nn.MultiheadAttention")
def from_torch(m: nn.Module, **hints):
    if not isinstance(m, nn.MultiheadAttention):
        return None
    if m.bias_k is not None or m.add_zero_attn:
        raise AttentionError(
            "nn.MultiheadAttention with add_bias_kv=True or add_zero_attn=True appends extra keys, which "
            "MultiHeadAttention does not model; expected both off. multihead.compat.MultiheadAttention takes "
            "both: load this module's state dict into one built with the same arguments."
        )
    E = m.embed_dim
    if m._qkv_same_embed_dim:
        wq, wk, wv = m.in_proj_weight.chunk(3)  # each (E, E)
    else:
        wq, wk, wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight  # (E, E), (E, kdim), (E, vdim)
    bq = bk = bv = None
    if m.in_proj_bias is not None:
        bq, bk, bv = m.in_proj_bias.detach().split(E)
    out = (m.out_proj.weight.detach(), None if m.out_proj.bias is None else m.out_proj.bias.detach())
    return linears_to_module(
        (wq.detach(), bq), (wk.detach(), bk), (wv.detach(), bv), out,
        num_heads=m.num_heads, batch_first=m.batch_first, dropout=m.dropout, causal=hints.get("causal", False),
    )
