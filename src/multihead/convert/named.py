"""Converters for modules with four separate projections, recognised by their names alone.

Each naming style below is one row: where the query/key/value/output linear layers live, which layout
the source uses, where its head count and attention dropout are. The class of the module never matters,
so a learner's own class with the same names converts too. Shapes: E embed, H heads, D head dim.

    style                          q / k / v                         out        layout
    document 000                   q_linear / k_linear / v_linear    o_linear   (B, L, E)
    document 001 (split heads)     Wq / Wk / Wv                      Wo         (B, L, E), causal
    document 002, d2l              W_q / W_k / W_v                   W_o        (B, L, E)
    labml (document 003)           query.linear / key.linear / ...   output     (L, B, E)
    one head, or LLMs-from-scratch W_query / W_key / W_value         out_proj?  (B, L, E), causal

A source that keeps a causal mask buffer (document 001's triu `mask`) converts to a causal module
(`causal=True`, every call masks the future); the hint `causal=` overrides what is detected.

Also here: the explicit fallback `from_module(m, num_heads=H, q=..., k=..., v=..., out=...)`, where each
projection is a linear layer, a (weight, bias) pair, or the dotted name of a linear layer inside m.
"""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from multihead.convert.projections import (build_attention, check_no_extra_linears, find_dropout, find_head_count,
                                           has_causal_buffer, linear_at, require_head_count, submodule)
from multihead.convert.registry import register_converter
from multihead.errors import AttentionError
from multihead.layers.multi_head import MultiHeadAttention


@dataclass(frozen=True)
class NamingStyle:
    """Where one convention keeps its projections. out: candidate names, None allowed if not out_required."""

    name: str
    q: str
    k: str
    v: str
    out: tuple[str, ...]
    out_required: bool = True
    batch_first: bool = True
    head_owners: tuple[str, ...] = ()  # submodules that may also hold the head count
    dropout: tuple[str, ...] = ("dropout",)
    single_head_without_count: bool = False  # no head count and no output projection = one head


STYLES = (
    NamingStyle("document 000 (q_linear/k_linear/v_linear/o_linear)", "q_linear", "k_linear", "v_linear",
                ("o_linear",)),
    NamingStyle("document 001's split heads (Wq/Wk/Wv/Wo)", "Wq", "Wk", "Wv", ("Wo",)),
    NamingStyle("W_q/W_k/W_v/W_o (document 002, d2l)", "W_q", "W_k", "W_v", ("W_o",),
                dropout=("attention.dropout", "dropout")),
    NamingStyle("labml (query.linear/key.linear/value.linear/output)", "query.linear", "key.linear",
                "value.linear", ("output",), batch_first=False, head_owners=("query",)),
    NamingStyle("W_query/W_key/W_value (one causal head, or heads with out_proj)", "W_query", "W_key", "W_value",
                ("out_proj",), out_required=False, single_head_without_count=True),
)


def convert_named(module: nn.Module, style: NamingStyle, hints: dict) -> MultiHeadAttention | None:
    """The module converted under `style`, or None when its names do not follow `style`."""
    q, k, v = (linear_at(module, path) for path in (style.q, style.k, style.v))
    out = next((found for path in style.out if (found := linear_at(module, path)) is not None), None)
    if q is None or k is None or v is None or (out is None and style.out_required):
        return None
    check_no_extra_linears(module, (q, k, v, out), style.name)
    owners = [submodule(module, path) for path in style.head_owners]
    if style.single_head_without_count and out is None and find_head_count(hints, module, *owners) is None:
        num_heads = 1
    else:
        num_heads = require_head_count(module, hints, style.name, *owners)
    return build_attention(q, k, v, out, num_heads, batch_first=hints.get("batch_first", style.batch_first),
                           dropout=find_dropout(module, *style.dropout),
                           causal=hints.get("causal", has_causal_buffer(module)), training=module.training)


def _style_converter(style: NamingStyle):
    def convert(module: nn.Module, **hints) -> MultiHeadAttention | None:
        return convert_named(module, style, hints)

    convert.__doc__ = f"Converter for {style.name}: q={style.q}, k={style.k}, v={style.v}, out={style.out}."
    return convert


def convert_explicit(module: nn.Module, **hints) -> MultiHeadAttention | None:
    """from_module(m, num_heads=H, q=..., k=..., v=..., out=None): the projections named by the caller.

    Each of q/k/v/out is a linear layer, a (weight, bias) pair, or the dotted name of a linear layer in
    `module`; out may be left out (the heads' concatenation is the output). Returns None without q=.
    """
    if hints.get("q") is None:
        return None
    missing = [role for role in ("k", "v") if hints.get(role) is None]
    if missing:
        raise AttentionError(f"explicit projections need q=, k= and v= (out= is optional); missing {missing}.")
    if hints.get("num_heads") is None:
        raise AttentionError("explicit projections need the head count too: pass num_heads=...")
    layers = {}
    for role in ("q", "k", "v", "out"):
        layer = hints.get(role)
        if isinstance(layer, str):
            found = linear_at(module, layer)
            if found is None:
                raise AttentionError(f"{role}={layer!r}: {type(module).__name__} has no linear layer at that name.")
            layer = found
        layers[role] = layer
    return build_attention(layers["q"], layers["k"], layers["v"], layers["out"], hints["num_heads"],
                           batch_first=hints.get("batch_first", True), num_kv_heads=hints.get("num_kv_heads"),
                           dropout=find_dropout(module, "dropout"), causal=hints.get("causal", False),
                           training=module.training)


register_converter("explicit projections")(convert_explicit)
for _style in STYLES:
    register_converter(_style.name)(_style_converter(_style))
