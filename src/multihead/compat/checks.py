"""check_call: every check torch.nn.MultiheadAttention makes on one call, in torch's order, with torch's types.

Each failure is a CompatAssertionError or CompatRuntimeError (see compat.errors): the type torch raises
for the same input, and an AttentionError whose message says what was expected and what came.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from multihead.compat.errors import CompatAssertionError, CompatPaddingMaskError, CompatRuntimeError
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
            f"embed_dim must be divisible by num_heads: each head gets embed_dim // num_heads features; "
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
            "is_causal=True is a hint that attn_mask is the causal mask, so attn_mask is required; got None. "
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
            raise CompatPaddingMaskError(
                f"key_padding_mask must be {'(S,)' if unbatched else '(B, S)'} = {shape_str(expected)}: one entry "
                f"per key{'' if unbatched else ' of each sequence'}; got {shape_str(key_padding_mask.shape)}.")
    return CallShape(unbatched, B, L, S, drop)


def _check_mask_dtype(mask, name: str) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise AttentionError(f"{name} must be a bool or float tensor; got {type(mask).__name__}.")
    if not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise CompatAssertionError(f"{name} must be a bool tensor (True = blocked) or a float tensor (added to "
                                   f"the scores); got dtype {mask.dtype}.")


def _check_ranks(m, query, key, value, key_padding_mask, attn_mask) -> bool:
    """CompatAssertionError unless the ranks fit (as torch's shape check); return whether unbatched."""
    layout = "(B, L, E)" if m.batch_first else "(L, B, E)"
    if query.dim() not in (2, 3):
        raise CompatAssertionError(f"query must be (L, E) unbatched or {layout} batched (batch_first="
                                   f"{m.batch_first}); got {query.dim()}-D shape {shape_str(query.shape)}.")
    unbatched = query.dim() == 2
    kind = "unbatched (2-D)" if unbatched else "batched (3-D)"
    if key.dim() != query.dim() or value.dim() != query.dim():
        raise CompatAssertionError(f"for a {kind} query, key and value must be {query.dim()}-D too; got key "
                                   f"{shape_str(key.shape)} and value {shape_str(value.shape)}.")
    if key_padding_mask is not None and key_padding_mask.dim() != (1 if unbatched else 2):
        raise CompatPaddingMaskError(
            f"for a {kind} query, key_padding_mask must be {'1-D (S,)' if unbatched else '2-D (B, S)'}; "
            f"got {key_padding_mask.dim()}-D shape {shape_str(key_padding_mask.shape)}.")
    if attn_mask is not None and attn_mask.dim() not in (2, 3):
        raise CompatAssertionError(f"attn_mask must be 2-D (L, S) or 3-D ({'H' if unbatched else 'B*H'}, L, S); "
                                   f"got {attn_mask.dim()}-D shape {shape_str(attn_mask.shape)}.")
    if unbatched and attn_mask is not None and attn_mask.dim() == 3:
        expected = (m.num_heads, query.shape[0], key.shape[0])
        if tuple(attn_mask.shape) != expected:
            raise CompatAssertionError(f"for an unbatched query, a 3-D attn_mask must be (H, L, S) = "
                                       f"{shape_str(expected)}; got {shape_str(attn_mask.shape)}.")
    return unbatched


def _check_features(m, query, key, value) -> None:
    """Feature sizes and dtypes, as the in-projection needs them."""
    if query.shape[-1] != m.embed_dim:
        raise CompatAssertionError(f"query must have embed_dim={m.embed_dim} features in its last dim; got "
                                   f"shape {shape_str(query.shape)}.")
    separate = not m._qkv_same_embed_dim
    if separate and key.shape[:-1] != value.shape[:-1]:
        raise CompatAssertionError(f"key and value must agree on all but the last dim; got key "
                                   f"{shape_str(key.shape)} and value {shape_str(value.shape)}.")
    if not separate and key.shape != value.shape:
        raise CompatAssertionError(f"key and value must have the same shape (kdim = vdim = embed_dim = {m.embed_dim}); "
                                   f"got key {shape_str(key.shape)} and value {shape_str(value.shape)}.")
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
        raise CompatRuntimeError(f"attn_mask must be (L, S) = {shape_str((L, S))} or {heads} = "
                                 f"{shape_str((BH, L, S))}; got {shape_str(attn_mask.shape)}.")
