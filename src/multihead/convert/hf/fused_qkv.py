"""A Hugging Face decoder layer whose queries, keys and values come out of one projection: Phi-3's ``qkv_proj``.

Phi-3 computes ``qkv = qkv_proj(x)`` and cuts it by position: H*D query rows, then Hkv*D key rows and Hkv*D
value rows (grouped-query attention makes the cut uneven). The cut is read where the layer itself makes it:
the layer runs once under the dataflow (``convert.flow_roles.watch``) on a probe, with neutral rotary tables
(cos 1, sin 0) and no mask, and the pieces of qkv_proj's output it uses apart are the three row ranges. The
attention maths names them (the scores' first operand is the query); their sizes must be the ones the
config states, or the layer is refused.

    qkv_proj weight ((H + 2 Hkv) * D, E)  ->  q (H*D, E), k (Hkv*D, E), v (Hkv*D, E), each with its bias rows
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.convert.flow_roles import watch
from multihead.errors import AttentionError

PROBE_LENGTH = 3


def fused_qkv(module: nn.Module, qkv: nn.Linear, num_heads: int, num_kv_heads: int, head_dim: int,
              rotary_dim: int) -> tuple[tuple, tuple, tuple]:
    """((weight, bias) of the queries, of the keys, of the values): ``qkv``'s rows as ``module``'s forward
    cuts them; AttentionError when the cut is not H*D, Hkv*D, Hkv*D rows."""
    weight = qkv.weight
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(1, PROBE_LENGTH, qkv.in_features, generator=generator).to(weight)
    cos = torch.ones(1, PROBE_LENGTH, rotary_dim, dtype=weight.dtype, device=weight.device)

    def call():
        return module(x, position_embeddings=(cos, torch.zeros_like(cos)), attention_mask=None)

    try:
        watched = watch(module, call, {"x": x})
    except Exception as error:  # a layer that does not take (hidden_states, position_embeddings, attention_mask)
        raise AttentionError(f"{type(module).__name__}: could not run its forward to see how it cuts qkv_proj "
                             f"({type(error).__name__}: {error}).") from error
    index = watched.map_of(weight)
    pieces = watched.pieces.get(index, [])
    roles = watched.roles
    if roles is not None and all(len(r) == 1 and r[0].map == index for r in (roles.q, roles.k, roles.v)):
        pieces = [roles.q[0], roles.k[0], roles.v[0]]
    wanted = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    got = [len(p.rows) for p in pieces]
    if got != wanted:
        raise AttentionError(
            f"{type(module).__name__} cuts qkv_proj's {qkv.out_features} output rows into pieces of {got}; expected "
            f"queries, keys and values of {wanted} rows (H={num_heads}, Hkv={num_kv_heads}, D={head_dim}).")
    bias = qkv.bias
    return tuple((weight.detach()[p.rows], None if bias is None else bias.detach()[p.rows]) for p in pieces)
