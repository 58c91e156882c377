"""The converter registry behind MultiHeadAttention.from_module.

A converter takes (module, **hints) and returns a MultiHeadAttention with the same outputs, or None
when the module is not its style. Converters live one style per file; STYLE_MODULES lists them
and they are imported on the first from_module call, in that order.
"""
from __future__ import annotations

import copy
import importlib
from collections.abc import Callable

import torch
from torch import nn

from multihead.errors import AttentionError, shape_str
from multihead.layers.multi_head import MultiHeadAttention

STYLE_MODULES = [
    "multihead.convert.torch_mha",
    "multihead.convert.named",
    "multihead.convert.fused",
    "multihead.convert.hf.layers",
    "multihead.convert.stacked",
    "multihead.convert.hf.decoders",
    "multihead.convert.hf.gpt2",
    "multihead.convert.hf.neox",
    "multihead.convert.hf.latent",
    "multihead.convert.hf.deepseek_v4",
    "multihead.convert.traced",  # last: any module, read from its dataflow
]
_CONVERTERS: list[tuple[str, Callable]] = []
# What a caller may tell from_module when the module does not say it itself.
HINTS = {
    "num_heads": "the head count",
    "num_kv_heads": "fewer key/value heads (GQA), with explicit projections",
    "batch_first": "the source's layout",
    "causal": "whether the source masks the future inside its forward",
    "q": "the query projection (a Linear, a (weight, bias) pair, or a dotted name)",
    "k": "the key projection",
    "v": "the value projection",
    "out": "the output projection (None: no output projection)",
}
_loaded = False


def register_converter(name: str):
    """Decorator: add `fn(module, **hints) -> MultiHeadAttention | None` under `name`."""

    def add(fn):
        _CONVERTERS.append((name, fn))
        return fn

    return add


def register_refusal(style: str, recognises: Callable[[nn.Module], bool], what: str, convert_with: str) -> Callable:
    """Register a converter that refuses the modules `recognises` accepts: they are `what`, which
    MultiHeadAttention cannot hold, and `convert_with` (e.g. "mh.X.from_module(layer)") converts them."""

    def refuse(module: nn.Module, **hints) -> None:
        if recognises(module):
            raise AttentionError(f"{type(module).__name__} is {what}, which MultiHeadAttention cannot hold. "
                                 f"Convert it with {convert_with}.")
        return None

    return register_converter(style)(refuse)


def converter_names() -> list[str]:
    _load_styles()
    return [name for name, _ in _CONVERTERS]


def _load_styles() -> None:
    global _loaded
    if not _loaded:
        for path in STYLE_MODULES:
            importlib.import_module(path)
        _loaded = True


def from_module(module: nn.Module, **hints):
    """Convert `module` with the first converter that recognises it; AttentionError if none does."""
    if isinstance(module, MultiHeadAttention):
        return copy.deepcopy(module)
    if not isinstance(module, nn.Module):
        raise AttentionError(f"from_module expects a torch.nn.Module; got {type(module).__name__}.")
    unknown = sorted(set(hints) - set(HINTS))
    if unknown:
        raise AttentionError(f"from_module got unknown hints {unknown}; expected some of {sorted(HINTS)}.")
    _load_styles()
    for _, convert in _CONVERTERS:
        result = convert(module, **hints)
        if result is not None:
            return result
    raise AttentionError(
        f"cannot recognise {type(module).__name__} as an attention module. Found: {describe_linears(module)}. "
        f"Known styles: {', '.join(converter_names())}. Pass num_heads=... if the head count is the "
        "problem, or the projections explicitly: from_module(m, num_heads=H, q=m.a, k=m.b, v=m.c, out=m.d)."
    )


def describe_linears(module: nn.Module) -> str:
    """'q_lin: Linear(16 -> 16), ...' for every Linear inside `module`, for error messages."""
    found = [
        f"{name}: {type(sub).__name__}({_in_features(sub)} -> {sub.out_features}"
        f"{'' if sub.bias is not None else ', no bias'})"
        for name, sub in module.named_modules()
        if isinstance(sub, nn.Linear)
    ]
    return ", ".join(found) if found else "no nn.Linear layers"


def _in_features(layer: nn.Linear) -> str:
    """The input width, or "?" for a LazyLinear that has not seen an input yet."""
    return "?" if isinstance(layer.weight, nn.parameter.UninitializedParameter) else str(layer.in_features)


def linears_to_module(q, k, v, out, *, num_heads: int, num_kv_heads: int | None = None,
                      batch_first: bool = True, dropout: float = 0.0, causal: bool = False,
                      module_class: type[MultiHeadAttention] = MultiHeadAttention, **options):
    """Build a MultiHeadAttention from four (weight, bias-or-None) pairs in nn.Linear layout.

    q weight (H*D, E), k (Hkv*D, kdim), v (Hkv*D, vdim), out (O, H*D); out=None means no output
    projection (identity). causal=True when the source masks the future inside its forward.
    options: further MultiHeadAttention arguments (rope, window, softcap, scale, qk_norm, ...).
    module_class: MultiHeadAttention or a variant taking its arguments (GatedMultiHeadAttention).
    Weights are copied, so the source module stays independent.
    """
    (wq, bq), (wk, bk), (wv, bv) = q, k, v
    inner = wq.shape[0]
    if inner % num_heads:
        raise AttentionError(
            f"the query projection has {inner} outputs, not divisible by num_heads={num_heads}."
        )
    head_dim = inner // num_heads
    num_kv_heads = num_kv_heads or wk.shape[0] // head_dim
    if out is None:  # no output projection: the concatenated heads are the output
        out = (torch.eye(inner, dtype=wq.dtype, device=wq.device), None)
    wo, bo = out
    for name, w, rows in (("key", wk, num_kv_heads * head_dim), ("value", wv, num_kv_heads * head_dim)):
        if w.shape[0] != rows:
            raise AttentionError(
                f"the {name} projection has shape {shape_str(w.shape)}; expected {rows} outputs "
                f"({num_kv_heads} heads x {head_dim})."
            )
    if wo.shape[1] != inner:
        raise AttentionError(f"the output projection has shape {shape_str(wo.shape)}; expected {inner} inputs.")
    bias = {"q": bq is not None, "k": bk is not None, "v": bv is not None, "out": bo is not None}
    mod = module_class(
        wq.shape[1], num_heads, kdim=wk.shape[1], vdim=wv.shape[1], head_dim=head_dim,
        num_kv_heads=num_kv_heads, out_dim=wo.shape[0], bias=bias, dropout=dropout,
        batch_first=batch_first, causal=causal, device=wq.device, dtype=wq.dtype, **options,
    )
    with torch.no_grad():
        for proj, (w, b) in zip((mod.q_proj, mod.k_proj, mod.v_proj, mod.out_proj), (q, k, v, out)):
            proj.weight.copy_(w)
            if b is not None:
                proj.bias.copy_(b)
    return mod
