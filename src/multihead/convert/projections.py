"""What every converter shares: finding projections and the head count, then building the module.

A projection is a linear layer, `y = x @ weight.T + bias`: weight (out_features, in_features), bias
(out_features,) or None. Shapes: E query features, kdim/vdim key/value features, H heads, Hkv kv
heads, D head dim, O output features.

    q   (H*D, E)      k (Hkv*D, kdim)      v (Hkv*D, vdim)      out (O, H*D), or None = identity

Also here: reading a head count, a dropout probability or a causal mask buffer from a module, and
finding linear layers by dotted name (`"query.linear"`), so that each converter states only its naming.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

from multihead.convert.model_attributes import model_attribute, spellings
from multihead.convert.registry import describe_linears, linears_to_module
from multihead.errors import AttentionError, shape_str
from multihead.layers.multi_head import MultiHeadAttention

HEAD_COUNT_NAMES = spellings("num_heads")  # the names of a head count, in the order tried (model_attributes)


def submodule(module: nn.Module, path: str) -> nn.Module | None:
    """The submodule at dotted `path` (e.g. "self.query"), or None when any step is missing."""
    for name in path.split("."):
        module = module._modules.get(name) if isinstance(module, nn.Module) else None
        if module is None:
            return None
    return module


def linear_at(module: nn.Module, path: str) -> nn.Linear | None:
    """The nn.Linear (LazyLinear included) at dotted `path`, or None when there is none."""
    found = submodule(module, path)
    return found if isinstance(found, nn.Linear) else None


def check_no_extra_linears(module: nn.Module, used, style: str) -> None:
    """Raise when `module` holds linear layers besides `used`: its outputs would not be attention's alone.

    (A whole transformer block, say, has feed-forward layers too; convert its attention submodule.)
    """
    used_ids = {id(layer) for layer in used if isinstance(layer, nn.Module)}
    extra = [f"{name} ({'?' if isinstance(child.weight, UninitializedParameter) else child.in_features} -> "
             f"{child.out_features})" for name, child in module.named_modules()
             if isinstance(child, nn.Linear) and id(child) not in used_ids]
    if extra:
        raise AttentionError(
            f"{type(module).__name__} follows {style} but also has linear layers that attention does not use: "
            f"{', '.join(extra)}. Its outputs would differ; convert the attention submodule itself, or pass "
            "the projections explicitly: from_module(m, num_heads=H, q=..., k=..., v=..., out=...)."
        )


def weight_and_bias(layer, role: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight (out, in), bias (out,) or None) of a linear layer or of a (weight, bias) pair.

    A LazyLinear that has not seen an input yet has no weights: raise, asking for one forward first.
    """
    if isinstance(layer, nn.Module):
        weight, bias = getattr(layer, "weight", None), getattr(layer, "bias", None)
    elif isinstance(layer, (tuple, list)) and len(layer) == 2:
        weight, bias = layer
    else:
        raise AttentionError(
            f"the {role} projection must be a linear layer or a (weight, bias) pair; got {type(layer).__name__}."
        )
    if isinstance(weight, UninitializedParameter) or isinstance(bias, UninitializedParameter):
        raise AttentionError(
            f"the {role} projection is an uninitialised LazyLinear: its input size is not known yet. "
            "Run the module forward once on an example input, then convert it."
        )
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        got = shape_str(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__
        raise AttentionError(f"the {role} projection needs a 2-D weight (out_features, in_features); got {got}.")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != weight.shape[:1]):
        got = shape_str(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise AttentionError(f"the {role} projection's bias must have shape ({weight.shape[0]},); got {got}.")
    return weight, bias


def find_head_count(hints: dict, *owners: nn.Module | None) -> int | None:
    """The `num_heads` hint, else the first int head-count attribute on `owners` or their `config`."""
    if hints.get("num_heads") is not None:
        return hints["num_heads"]
    for owner in owners:
        if owner is None:
            continue
        value = model_attribute(owner, "num_heads", None, types=(int,))
        config = getattr(owner, "config", None)
        if value is None and config is not None:  # a config's own name for it comes first there
            value = model_attribute(config, "num_attention_heads", None, types=(int,))
        if value is not None:
            return value
    return None


def require_head_count(module: nn.Module, hints: dict, style: str, *owners: nn.Module | None) -> int:
    """find_head_count(hints, module, *owners), or AttentionError naming what was found."""
    num_heads = find_head_count(hints, module, *owners)
    if num_heads is None:
        tried = ", ".join(HEAD_COUNT_NAMES)
        raise AttentionError(
            f"{type(module).__name__} looks like {style} (found {describe_linears(module)}) but it does not say how "
            f"many heads it has (no int attribute among {tried}, nor config.num_attention_heads). "
            "Pass it: MultiHeadAttention.from_module(m, num_heads=...)."
        )
    return num_heads


def find_dropout(module: nn.Module, *paths: str) -> float:
    """The probability of the first nn.Dropout found at `paths` (dropout on attention weights), else 0."""
    for path in paths:
        found = submodule(module, path)
        if isinstance(found, nn.Dropout):
            return float(found.p)
    return 0.0


def has_causal_buffer(*modules: nn.Module | None) -> bool:
    """True when one of `modules` keeps a causal mask as a buffer of its own, of size S x S (S >= 2).

    Either triu(ones, 1), 1 = a future key (document 001's `mask`), or tril(ones), 1 = may attend
    (nanoGPT's `bias` (1, 1, S, S), the GPT lecture's `tril`). Such a source is causal on every call.
    """
    for module in modules:
        for buffer in [] if module is None else module.buffers(recurse=False):
            size = buffer.shape[-1] if buffer.dim() >= 2 else 0
            if size < 2 or buffer.shape[-2] != size or buffer.numel() != size * size:
                continue
            square = buffer.reshape(size, size).to(torch.float32)  # drop leading 1s: (S, S)
            ones = torch.ones_like(square)
            if torch.equal(square, ones.triu(1)) or torch.equal(square, ones.tril()):
                return True
    return False


def build_attention(q, k, v, out, num_heads, *, batch_first: bool = True, num_kv_heads: int | None = None,
                    dropout: float = 0.0, causal: bool = False, training: bool = False,
                    **options) -> MultiHeadAttention:
    """A MultiHeadAttention computing exactly what the given projections compute (weights copied).

    q, k, v, out: linear layers or (weight, bias) pairs with the shapes in the module docstring;
    out=None means the heads' concatenation is the output (an identity out_proj). causal: the source
    masks the future inside its forward. training: the source's mode, so that an eval-mode source
    gives an eval-mode (dropout-free) result. options: further MultiHeadAttention arguments (rope,
    window, softcap, scale, qk_norm) for sources with positions or score variants.
    """
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads <= 0:
        raise AttentionError(f"num_heads must be a positive int; got {num_heads!r}.")
    for name, flag in (("batch_first", batch_first), ("causal", causal)):
        if not isinstance(flag, bool):
            raise AttentionError(f"{name} must be True or False; got {flag!r}.")
    pairs = [weight_and_bias(layer, role) for layer, role in ((q, "query"), (k, "key"), (v, "value"))]
    pairs.append(None if out is None else weight_and_bias(out, "output"))
    pairs = [None if pair is None else tuple(None if t is None else t.detach() for t in pair) for pair in pairs]
    mod = linears_to_module(*pairs, num_heads=num_heads, num_kv_heads=num_kv_heads, batch_first=batch_first,
                            dropout=dropout, causal=causal, **options)
    return mod.train(training)
