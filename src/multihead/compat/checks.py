"""check_call: every check torch.nn.MultiheadAttention makes on one call, in torch's order, with torch's types.

Each failure is a CompatAssertionError or CompatRuntimeError (see compat.errors): the type torch raises
for the same input, and an AttentionError whose message says what was expected and what came.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from multihead.compat.errors import (CompatAssertionError, CompatPaddingMaskError, CompatRuntimeError,
                                     PaddingMaskAssertionError, PaddingMaskRuntimeError)
from multihead.errors import AttentionError, check_flag, shape_str

__all__ = ["CallShape", "check_call", "check_construction"]


@dataclass(frozen=True)
class CallShape:
    """What one call's inputs are: B batch, L query length, S key length (before any extra key)."""

    unbatched: bool
    B: int
    L: int
    S: int
    drop_attn_mask: bool  # is_causal hint trusted: torch replaces attn_mask by its own causal mask


def check_construction(embed_dim, num_heads) -> None:
    """AttentionError for non-positive sizes (torch: ValueError); CompatAssertionError when E % H != 0."""
    for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise AttentionError(f"{name} must be a positive int; got {value!r}.")
    if embed_dim % num_heads:
        raise CompatAssertionError(
            f"embed_dim must be divisible by num_heads (each head gets embed_dim // num_heads features); "
            f"got embed_dim={embed_dim} and num_heads={num_heads} (remainder {embed_dim % num_heads}).")


def check_call(m: nn.MultiheadAttention, query, key, value, key_padding_mask, attn_mask, need_weights,
               is_causal) -> CallShape:
    """Raise unless the call fits `m`; return its sizes. Order and error types follow torch's forward."""
    check_flag(is_causal, "is_causal")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, Tensor):
            raise AttentionError(f"{name} must be a torch.Tensor; got {type(t).__name__}.")
    for name, mask in (("key_padding_mask", key_padding_mask), ("attn_mask", attn_mask)):
        _check_mask_dtype(mask, name)
    unbatched = _check_ranks(m, query, key, value, key_padding_mask, attn_mask)
    if is_causal and attn_mask is None:
        raise CompatRuntimeError(
            "Need attn_mask if specifying the is_causal hint: is_causal=True says that attn_mask is the causal mask, "
            "so attn_mask is required; got None. "
            "Pass attn_mask=nn.Transformer.generate_square_subsequent_mask(L) with it.")
    _check_features(m, query, key, value)
    B = 1 if unbatched else query.shape[0 if m.batch_first else 1]
    seq_dim = 1 if m.batch_first and not unbatched else 0
    L, S = query.shape[seq_dim], key.shape[seq_dim]
    drop = is_causal and key_padding_mask is None and not need_weights
    if attn_mask is not None and not drop:
        _check_attn_mask_size(attn_mask, B * m.num_heads, L, S, unbatched)
    if not unbatched:
        batch_dim = 0 if m.batch_first else 1
        if key.shape[batch_dim] != B:
            raise CompatRuntimeError(f"query has batch {B} but key and value have batch {key.shape[batch_dim]} "
                                     f"(batch dim {batch_dim}, batch_first={m.batch_first}); they must agree.")
    if key_padding_mask is not None:
        expected = (S,) if unbatched else (B, S)
        if tuple(key_padding_mask.shape) != expected:
            raise padding_error(m, query, key, value,
                                f"key_padding_mask must be {'(S,)' if unbatched else '(B, S)'} = {shape_str(expected)}: "
                                f"one entry per key{'' if unbatched else ' of each sequence'}; got "
                                f"{shape_str(key_padding_mask.shape)}.")
    return CallShape(unbatched, B, L, S, drop)


def padding_error(m, query, key, value, message: str) -> CompatPaddingMaskError:
    """The bad-key_padding_mask error of the type torch raises on the path it takes for this call."""
    return (PaddingMaskRuntimeError if torch_fast_path(m, query, key, value) else PaddingMaskAssertionError)(message)


def torch_fast_path(m: nn.MultiheadAttention, query, key, value) -> bool:
    """Whether torch.nn.MultiheadAttention.forward takes its fused inference path for this call: batched
    self-attention (one tensor for query, key and value) in eval mode, batch_first, an even head count, one
    in-projection of the query's dtype, no bias_k / zero attention, no autocast, nothing that needs grad."""
    if not torch.backends.mha.get_fastpath_enabled() or query.dim() != 3 or query is not key or key is not value:
        return False
    if m.training or m.num_heads % 2 or not m.batch_first or m.bias_k is not None or m.add_zero_attn:
        return False
    if not m._qkv_same_embed_dim or m.in_proj_weight is None or query.dtype != m.in_proj_weight.dtype:
        return False
    if m.in_proj_bias is not None and query.dtype != m.in_proj_bias.dtype or torch.is_autocast_enabled():
        return False
    tensors = (query, m.in_proj_weight, m.in_proj_bias, m.out_proj.weight, m.out_proj.bias)
    return not (torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors))


def _check_mask_dtype(mask, name: str) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise AttentionError(f"{name} must be a bool or float tensor; got {type(mask).__name__}.")
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise CompatAssertionError(f"only bool and floating types of {name} are supported: a bool tensor (True = "
                                   f"blocked) or a float tensor (added to the scores); got dtype {mask.dtype}.")


def _check_ranks(m, query, key, value, key_padding_mask, attn_mask) -> bool:
    """CompatAssertionError unless the ranks fit (as torch's shape check); return whether unbatched."""
    layout = "(B, L, E)" if m.batch_first else "(L, B, E)"
    if query.dim() not in (2, 3):
        raise CompatAssertionError(f"query should be unbatched 2D or batched 3D tensor but received {query.dim()}-D "
                                   f"query tensor: expected (L, E) or {layout} (batch_first={m.batch_first}); "
                                   f"got shape {shape_str(query.shape)}.")
    unbatched = query.dim() == 2
    kind = "unbatched (2-D)" if unbatched else "batched (3-D)"
    if key.dim() != query.dim() or value.dim() != query.dim():
        raise CompatAssertionError(f"For {kind} `query`, expected `key` and `value` to be {query.dim()}-D but found "
                                   f"{key.dim()}-D and {value.dim()}-D tensors respectively: key "
                                   f"{shape_str(key.shape)}, value {shape_str(value.shape)}.")
    if key_padding_mask is not None and key_padding_mask.dim() != (1 if unbatched else 2):
        raise padding_error(
            m, query, key, value,
            f"For {kind} `query`, expected `key_padding_mask` to be `None` or {1 if unbatched else 2}-D but found "
            f"{key_padding_mask.dim()}-D tensor instead: it is {'(S,)' if unbatched else '(B, S)'}, one entry per "
            f"key; got shape {shape_str(key_padding_mask.shape)}.")
    if attn_mask is not None and attn_mask.dim() not in (2, 3):
        raise CompatAssertionError(f"For {kind} `query`, expected `attn_mask` to be `None`, 2-D or 3-D but found "
                                   f"{attn_mask.dim()}-D tensor instead: it is (L, S) or "
                                   f"({'H' if unbatched else 'B*H'}, L, S); got shape {shape_str(attn_mask.shape)}.")
    if unbatched and attn_mask is not None and attn_mask.dim() == 3:
        expected = (m.num_heads, query.shape[0], key.shape[0])
        if tuple(attn_mask.shape) != expected:
            raise CompatAssertionError(f"Expected `attn_mask` shape to be {shape_str(expected)} = (H, L, S) for an "
                                       f"unbatched query, but got {shape_str(attn_mask.shape)}.")
    return unbatched


def _check_features(m, query, key, value) -> None:
    """Feature sizes and dtypes, as the in-projection needs them."""
    if query.shape[-1] != m.embed_dim:
        raise CompatAssertionError(f"was expecting embedding dimension of {m.embed_dim}, but got {query.shape[-1]}: "
                                   f"query must have embed_dim={m.embed_dim} features in its last dim; got shape "
                                   f"{shape_str(query.shape)}.")
    separate = not m._qkv_same_embed_dim
    if separate and key.shape[:-1] != value.shape[:-1]:
        raise CompatAssertionError(f"key's sequence and batch dims do not match value's: key and value must agree on "
                                   f"all but the last dim; got key {shape_str(key.shape)} and value "
                                   f"{shape_str(value.shape)}.")
    if not separate and key.shape != value.shape:
        raise CompatAssertionError(f"key shape {shape_str(key.shape)} does not match value shape "
                                   f"{shape_str(value.shape)}: with kdim = vdim = embed_dim = {m.embed_dim} they must "
                                   "have the same shape.")
    error = CompatAssertionError if separate else CompatRuntimeError  # torch: a shape assert, or linear's error
    for name, t, width in (("key", key, m.kdim), ("value", value, m.vdim)):
        if t.shape[-1] != width:
            raise error(f"{name} must have {'kdim' if name == 'key' else 'vdim'}={width} features in its last "
                        f"dim; got shape {shape_str(t.shape)}.")
    weight = m.in_proj_weight if m.in_proj_weight is not None else m.q_proj_weight
    autocast = torch.is_autocast_enabled(query.device.type)
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.dtype != weight.dtype and not autocast:
            raise CompatRuntimeError(f"{name} has dtype {t.dtype} but the projection weights are {weight.dtype}; "
                                     f"convert one of them (module.to(dtype) or {name}.to(dtype)).")


def _check_attn_mask_size(attn_mask: Tensor, BH: int, L: int, S: int, unbatched: bool) -> None:
    expected = (L, S) if attn_mask.dim() == 2 else (BH, L, S)
    if tuple(attn_mask.shape) != expected:
        heads = "(H, L, S)" if unbatched else "(B*H, L, S)"
        raise CompatRuntimeError(f"The shape of the {attn_mask.dim()}D attn_mask is {shape_str(attn_mask.shape)}, but "
                                 f"should be {shape_str(expected)}: attn_mask is (L, S) = {shape_str((L, S))} or "
                                 f"{heads} = {shape_str((BH, L, S))}.")
