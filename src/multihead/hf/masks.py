"""Hugging Face's mask description -> one multihead Mask (the "multihead" AttentionMaskInterface entry).

transformers builds a model's masks in masking_utils (create_causal_mask and its siblings) and hands
the pattern to the registered mask function as arguments, not as a tensor:

    batch_size, q_length, kv_length, q_offset, kv_offset  the grid: query i sits at position i + q_offset,
                                                          key j at j + kv_offset
    mask_function    the pattern, index-based: causal_mask_function, bidirectional_mask_function, or
                     and_masks(sliding_window_overlay(w), causal_mask_function), ...
    attention_mask   (B, seen + q_length) bool, True = a real token (the tokenizer's padding mask)

`hf_mask` reads that description into structure: causal -> Mask.causal, sliding window ->
Mask.window, padding -> Mask.key_padding. The alignment follows the offsets: equal offsets are
top-left; a query block that ends at the last key (a KV cache, including HF's sliding-window cache)
is bottom-right. A StaticCache hands every static slot (kv_length = max_cache_len, kv_offset 0) with
q_offset = the tokens cached before this call (a 0-d tensor, so that compiled graphs do not recompile):
the keys past q_offset + q_length are empty slots, so the mask is Mask.lengths(q_offset + q_length)
with the pattern bottom-right aligned to those lengths; one interval of keys per query, the decode
kernel's form. On the CPU q_offset is read once per call; while torch.compile traces, the lengths are
computed from the tensor itself (no host read). A pattern it does not recognise (packed sequences, image-token overlays, a compiled
static cache's tensor offsets, and any combined pattern while torch.compile traces, since dynamo cannot
read a closure's cells) is evaluated by transformers' own sdpa_mask into a dense keep mask, so nothing
is ever guessed. The result is always a Mask, possibly empty: the attention function reads a Mask as
the whole truth, and None as "transformers gave no mask". It is a PreparedMask (prepared_mask.py),
which also behaves as the tensor HF's eager mask function would have built, for the models that do
arithmetic on their mask instead of handing it to the attention function (Bloom, MPT).
"""
from __future__ import annotations

import torch
from transformers import masking_utils as hf

from multihead.backends.cpu.build import kernel
from multihead.hf.prepared_mask import PreparedMask
from multihead.masks import Mask
from multihead.masks.values import values_checkable

# The code objects of transformers' mask-function factories, to recognise the closures they return.
_AND_CODE = hf.and_masks(hf.causal_mask_function).__code__
_WINDOW_CODE = hf.sliding_window_overlay(1).__code__


def _closure(fn) -> dict:
    return dict(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__ or ())))


def pattern_parts(fn) -> list[tuple[str, int | None]] | None:
    """[("causal", None), ("window", size)] ... for a recognised mask function; None otherwise."""
    if fn is hf.causal_mask_function:
        return [("causal", None)]
    if fn is hf.bidirectional_mask_function:
        return []
    if torch.compiler.is_compiling():  # dynamo cannot read a closure's cells: let transformers evaluate it
        return None
    code = getattr(fn, "__code__", None)
    if code is _WINDOW_CODE:
        return [("window", int(_closure(fn)["sliding_window"]))]
    if code is _AND_CODE:
        parts: list[tuple[str, int | None]] = []
        for inner in _closure(fn)["mask_functions"]:
            found = pattern_parts(inner)
            if found is None:
                return None
            parts += found
        return parts
    return None


def _alignment(q_length: int, kv_length: int, q_offset, kv_offset) -> str | None:
    """"top_left" or "bottom_right" when the offsets say so; None when they are tensors or neither."""
    if not all(isinstance(n, int) for n in (q_offset, kv_offset)):
        return None
    if q_offset == kv_offset:
        return "top_left"
    if q_offset - kv_offset == kv_length - q_length:
        return "bottom_right"
    return None


def _static_slots(batch_size: int, q_length: int, kv_length: int, q_offset, kv_offset, device) -> Mask | None:
    """Mask.lengths over a StaticCache's slots (see the module docstring); None when the offsets are not a
    static cache's: kv_offset other than 0, or more queries than slots."""
    if not isinstance(kv_offset, int) or kv_offset != 0:
        return None
    if isinstance(q_offset, torch.Tensor):
        if q_offset.numel() != 1 or q_offset.is_floating_point():
            return None
        if not values_checkable(q_offset):  # compiling: lengths from the tensor itself
            return Mask.lengths((q_offset.reshape(1).to(torch.int64) + q_length).expand(batch_size))
        q_offset = int(q_offset)  # one host read per call
    if not isinstance(q_offset, int) or q_offset < 0 or q_offset + q_length > kv_length:
        return None
    if torch.device(device).type == "cpu":
        kernel()  # loaded now, eagerly: a compiled decode step can run it but cannot load it
    return Mask.lengths(torch.full((batch_size,), q_offset + q_length, dtype=torch.int64, device=device))


def _structured(parts, align: str) -> list[Mask]:
    return [Mask.causal(align) if kind == "causal" else Mask.window(size, align) for kind, size in parts]


def _padding(attention_mask, kv_length: int, kv_offset) -> Mask | None:
    """Mask.key_padding for keys kv_offset .. kv_offset + kv_length - 1; None when nothing is padding."""
    padded = hf.prepare_padding_mask(attention_mask, kv_length, kv_offset)  # (B, >= kv_offset + kv_length)
    if padded is None:
        return None
    real = padded[:, kv_offset:kv_offset + kv_length]
    if values_checkable(real) and bool(real.all()):  # free to read on CPU; never read under compile
        return None
    return Mask.key_padding(~real)  # (B, Lk), True = padding


def hf_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
            mask_function=hf.causal_mask_function, attention_mask: torch.Tensor | None = None,
            use_vmap: bool = False, device="cpu", dtype: torch.dtype = torch.float32, **kwargs) -> Mask:
    """The Mask for this layer type's attention: (B, 1, q_length, kv_length) as a structure."""
    if isinstance(attention_mask, Mask):  # prepared earlier (generate with a static cache): already whole
        return attention_mask
    parts = pattern_parts(mask_function)
    align = _alignment(q_length, kv_length, q_offset, kv_offset)
    static = None if parts is None or align is not None else _static_slots(
        batch_size, q_length, kv_length, q_offset, kv_offset, device)
    if parts is not None and align is not None:
        masks = _structured(parts, align)
    elif static is not None:
        masks = [static, *_structured(parts, "bottom_right")]
    else:  # transformers' own evaluation of the pattern, padding left to the part below
        keep = hf.sdpa_mask(batch_size, q_length, kv_length, q_offset, kv_offset, mask_function,
                            attention_mask=None, allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                            use_vmap=use_vmap, device=device)
        masks = [] if keep is None else [Mask.keep(keep)]  # (B, 1, Lq, Lk)
    padding = _padding(attention_mask, kv_length, kv_offset)
    masks += [] if padding is None else [padding]
    return PreparedMask(tuple(part for mask in masks for part in mask.parts), (batch_size, 1, q_length, kv_length),
                        dtype, device)
