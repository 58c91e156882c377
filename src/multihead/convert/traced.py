"""Converter for any attention module whose names no other converter knows: roles read from its dataflow.

The module is called once on a probe x (B, L, E) under ``flow_roles.watch``. The attention maths names the
roles: the pieces of linear maps that go into the scores (queries first) and into the weighted sum (values),
and the map that reads the result (the output projection, or none). So the projections may be nn.Linear,
a Linear class of the module's own (``F.linear``), raw parameters used with ``@``, ``matmul`` or ``einsum``
in either orientation, or one fused projection cut into q, k and v evenly or not (grouped-query attention).

The dataflow does not say the head count, whether the module is causal or turns q and k by position, nor
whether it computes plain attention at all. So the converted module is checked by behaviour: among the head
counts the widths allow (the ``num_heads`` hint or the module's own head-count attribute first), causal or
not (the ``causal`` hint fixes it) and RoPE or not (half-split or interleaved pairs, on the first R features
of each head when the dataflow shows heads used as [0:R] and [R:D]; the base from an attribute such as
``rope_theta``, else 10000), the first whose outputs equal the module's on two probes is returned; none:
AttentionError.

    q (H*D, E)   k (Hkv*D, E)   v (Hkv*D, E)   out (O, H*D) or identity      layout (B, L, E) in and out
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.convert.flow_roles import Watched, watch
from multihead.convert.projections import build_attention, find_dropout, find_head_count
from multihead.convert.registry import register_converter
from multihead.convert.rope_bases import rope_bases
from multihead.errors import AttentionError
from multihead.layers.multi_head import MultiHeadAttention
from multihead.positions import RoPE

STYLE = "any attention module, read from its dataflow (Linears of its own, raw parameters, fused or uneven qkv)"
PROBE = (2, 5)  # (B, L) of the probes


def _widths(module: nn.Module) -> list[int]:
    """The input widths to try: every size of every parameter with two or more axes, in order."""
    sizes = [s for p in module.parameters() if p.dim() >= 2 and not isinstance(p, nn.UninitializedParameter)
             for s in (p.shape[-1], p.shape[-2], *p.shape[:-2])]
    return list(dict.fromkeys(sizes))


def _first_tensor(value):
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def _watched_call(module: nn.Module) -> tuple[Watched, torch.Tensor] | None:
    """The first width whose probe the module takes as self-attention, watched; None when none runs."""
    dtype = next((p.dtype for p in module.parameters()), torch.float32)
    for width in _widths(module):
        x = torch.randn(*PROBE, width, generator=torch.Generator().manual_seed(0)).to(dtype)
        try:
            watched = watch(module, lambda: module(x), {"x": x})
        except Exception:  # not this width, or not a module called as module(x)
            continue
        out = _first_tensor(watched.output)
        if out is not None and out.shape[:2] == x.shape[:2]:
            return watched, x
    return None


def _pairs(watched: Watched, x: torch.Tensor) -> dict[str, tuple] | None:
    """Role -> (weight, bias) from the named pieces, and "rotary": R when q's and k's heads are used as [0:R]
    and [R:D] (else None); None unless q, k and v each come whole from x."""
    roles, maps = watched.roles, watched.flow.maps
    splits = {p.split for p in roles.q + roles.k}
    pairs = {"rotary": splits.pop() if len(splits) == 1 else None}
    for role, found in (("q", roles.q), ("k", roles.k), ("v", roles.v)):
        if len(found) != 1 or maps[found[0].map].reads.source != "x" or maps[found[0].map].read.shape[-1] != \
                x.shape[-1]:
            return None
        weight, bias = maps[found[0].map].weight_bias()
        rows = found[0].rows
        pairs[role] = (weight.detach()[rows], None if bias is None else bias.detach()[rows])
    out = None if roles.out is None else maps[roles.out]
    pairs["out"] = None if out is None else tuple(None if t is None else t.detach() for t in out.weight_bias())
    return pairs


def _ropes(module: nn.Module, head_dim: int, rotary: int | None) -> list[RoPE | None]:
    """None, then RoPE in both pairings at every base to try (on the first ``rotary`` features)."""
    if head_dim % 2 or (rotary is not None and rotary % 2):
        return [None]
    return [None] + [RoPE(head_dim, base, interleaved=interleaved, rotary_dim=rotary)
                     for base in rope_bases(module) for interleaved in (False, True)]


def _head_counts(module: nn.Module, hints: dict, rows: dict[str, int]) -> list[int]:
    """The head counts whose head size fits q's and k's rows (GQA: k's heads divide q's), hinted one first."""
    fitting = [h for h in range(1, rows["q"] + 1) if rows["q"] % h == 0 and rows["k"] % (rows["q"] // h) == 0
               and h % (rows["k"] // (rows["q"] // h)) == 0]
    first = find_head_count(hints, module)
    return [first] if first in fitting or hints.get("num_heads") is not None else \
        sorted(fitting, key=lambda h: (h == 1, -h))


@register_converter(STYLE)
def convert_traced(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """The module's attention rebuilt from its dataflow and checked on probes; None when it is not read as
    attention (module docstring)."""
    was_training = module.training
    module.eval()
    try:
        found = _watched_call(module)
        if found is None or found[0].roles is None:
            return None
        watched, x = found
        pairs = _pairs(watched, x)
        if pairs is None:
            return None
        return _matching(module, pairs, x, hints, was_training)
    finally:
        module.train(was_training)


def _matching(module, pairs: dict, x: torch.Tensor, hints: dict, training: bool) -> MultiHeadAttention:
    """The first (head count, causal) whose MultiHeadAttention gives the module's outputs on two probes."""
    probes = [x, torch.randn(3, 7, x.shape[-1], generator=torch.Generator().manual_seed(1)).to(x)]
    with torch.no_grad():
        wanted = [_first_tensor(module(p)) for p in probes]
    rows = {role: pairs[role][0].shape[0] for role in ("q", "k")}
    tolerance = 1e-4 if x.dtype != torch.float64 else 1e-10
    dropout = find_dropout(module, "dropout", "attn_dropout", "attention_dropout")
    for heads in _head_counts(module, hints, rows):
        for rope in _ropes(module, rows["q"] // heads, pairs["rotary"]):
            for causal in [hints["causal"]] if "causal" in hints else [False, True]:
                ours = build_attention(pairs["q"], pairs["k"], pairs["v"], pairs["out"], heads, causal=causal,
                                       num_kv_heads=rows["k"] // (rows["q"] // heads), dropout=dropout, rope=rope)
                with torch.no_grad():
                    got = [ours(p) for p in probes]
                if all(g.shape == w.shape and torch.allclose(g, w, rtol=tolerance, atol=tolerance * w.abs().max())
                       for g, w in zip(got, wanted)):
                    return ours.train(training)
    raise AttentionError(
        f"{type(module).__name__}: its dataflow reads as attention (queries {rows['q']} rows, keys {rows['k']} rows, "
        f"output {'none' if pairs['out'] is None else pairs['out'][0].shape[0]} rows) but no head count, causality "
        "and RoPE reproduce its outputs (it may mask, scale or turn q and k in its own way). Pass num_heads= and "
        "causal=, or the projections: from_module(m, num_heads=H, q=..., k=..., v=..., out=...).")
