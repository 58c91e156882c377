"""`use_quantized_cache(model, kv_dtype=torch.int8)`: any transformers decoder generates over int8 or fp8 keys
and values, read by multihead's quantized decode kernel.

    import multihead as mh, multihead.hf
    mh.hf.use_quantized_cache(model, kv_dtype=torch.int8)     # or torch.float8_e4m3fn
    model.generate(ids, max_new_tokens=32)                     # the cache holds codes + fp32 scales

Each token's key (and value) vector of each kv head is stored as codes with one fp32 scale (symmetric
absmax, multihead's quantized cache format: caches/quantized.py), about half the bytes of a bf16 cache.

How it meets transformers: the model still owns its Cache (the DynamicCache generate makes, or one you
pass). A forward pre-hook on each attention layer puts a `CodedCacheLayer` in that layer's slot the first
time the layer sees the cache (the slot must still be empty; a sliding-window layer's slot keeps its
float keys, which are few). Its `update` quantizes the new keys and
values and returns
- on the first call (the prompt, into an empty cache), the float keys and values as they came: the
  prompt attends to them through the usual path (the fastest exact prefill), as a float cache would;
- afterwards, the codes and scales of every cached token (`Quantized`), which the "multihead" attention
  function hands to the quantized read (backends/decode/quantized_numerics.py): the decode kernel's int8/fp8 build for
  a step, dequantized block by block otherwise.
The model's attention implementation becomes "multihead" (the read of codes needs it). `mh.trace()`
shows the reads as backend "quantized".
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

from multihead.caches.quantized import Quantized, check_kv_dtype, quantize
from multihead.errors import AttentionError
from multihead.hf.attention import NAME

FIRST_CAPACITY = 64  # tokens per sequence in a new layer; doubled whenever a call needs more
_HOOKS = "_multihead_quantized_hooks"


class CodedCacheLayer(DynamicLayer):
    """One layer's slot in a transformers Cache: codes (B, Hkv, M, D|Dv) and fp32 scales (B, Hkv, M)."""

    def __init__(self, kv_dtype: torch.dtype) -> None:
        super().__init__()
        self.kv_dtype = kv_dtype
        self.held = 0
        self.store: list[torch.Tensor] | None = None  # key codes, value codes, key scales, value scales

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Quantize and keep the new keys (B, Hkv, Lq, D) and values; the first call returns them as they came,
        later ones every cached token as `Quantized` (see the module docstring)."""
        if key_states.requires_grad and torch.is_grad_enabled():
            raise AttentionError("a quantized KV cache is for inference; got keys that require grad (generate, or "
                                 "run under torch.no_grad()).")
        Lq = key_states.shape[2]
        (kc, ks), (vc, vs) = quantize(key_states, self.kv_dtype), quantize(value_states, self.kv_dtype)
        self._room(kc, vc, Lq)
        for buffer, new in zip(self.store, (kc, vc, ks, vs)):
            buffer[:, :, self.held:self.held + Lq] = new
        first, self.held = self.held == 0, self.held + Lq
        self.is_initialized = True
        if first:
            return key_states, value_states
        kc, vc, ks, vs = (t[:, :, :self.held] for t in self.store)
        return Quantized(kc, ks, self.kv_dtype), Quantized(vc, vs, self.kv_dtype)

    def _room(self, kc: torch.Tensor, vc: torch.Tensor, Lq: int) -> None:
        """Make (or double) the buffers so that Lq more tokens fit."""
        if self.store is not None and self.store[0].shape[0] != kc.shape[0]:
            raise AttentionError(f"this cache holds {self.store[0].shape[0]} sequences; got {kc.shape[0]}.")
        M = 0 if self.store is None else self.store[0].shape[2]
        if self.held + Lq <= M:
            return
        size = max(FIRST_CAPACITY, 2 * M, self.held + Lq)
        B, Hkv = kc.shape[:2]
        store = [kc.new_zeros(B, Hkv, size, kc.shape[-1]), vc.new_zeros(B, Hkv, size, vc.shape[-1]),
                 kc.new_zeros(B, Hkv, size, dtype=torch.float32), kc.new_zeros(B, Hkv, size, dtype=torch.float32)]
        if self.store is not None:
            for new, old in zip(store, self.store):
                new[:, :, :self.held] = old[:, :, :self.held]
        self.store = store

    def get_seq_length(self) -> int:
        return self.held

    def reset(self) -> None:
        self.store, self.held, self.is_initialized = None, 0, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        self._select(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.store is not None:
            self._select(torch.arange(self.store[0].shape[0]).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._select(indices)

    def _select(self, index) -> None:
        if self.store is not None:
            index = torch.as_tensor(index, device=self.store[0].device).long()
            self.store = [t.index_select(0, index) for t in self.store]

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise AttentionError("a quantized cache cannot be cropped (assisted generation); generate without it.")

    def offload(self) -> None:  # the codes stay where they are
        return None

    def prefetch(self) -> None:
        return None


def _slot_hook(layer_idx: int, kv_dtype: torch.dtype):
    """A forward pre-hook that puts a CodedCacheLayer in the cache's slot `layer_idx` on first use."""
    def hook(module, args, kwargs):
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        if not isinstance(cache, Cache):
            return None
        layers = cache.layers
        while len(layers) <= layer_idx:
            layers.append(DynamicLayer())
        layer = layers[layer_idx]
        if isinstance(layer, CodedCacheLayer) and layer.kv_dtype == kv_dtype or \
                type(layer) is DynamicSlidingWindowLayer:  # a sliding window's few tokens stay in float
            return None
        if type(layer) is not DynamicLayer or layer.get_seq_length():
            raise AttentionError(f"layer {layer_idx}'s cache already holds {type(layer).__name__} states; a quantized "
                                 "cache starts empty in a DynamicCache (generate again, or pass a new DynamicCache).")
        layers[layer_idx] = CodedCacheLayer(kv_dtype)
        return None
    return hook


def is_cached_attention(module: nn.Module) -> bool:
    """A transformers attention layer that writes to the cache: an `...Attention` module with an int layer_idx."""
    return type(module).__name__.endswith("Attention") and isinstance(getattr(module, "layer_idx", None), int)


def use_quantized_cache(model: nn.Module, *, kv_dtype: torch.dtype = torch.int8) -> nn.Module:
    """Keep `model`'s keys and values as int8 or fp8 e4m3 codes while it generates (see the module docstring);
    switches the model to the "multihead" attention. Calling it again replaces the dtype. Returns the model.
    Raises AttentionError for another kv_dtype or a model without such attention layers."""
    check_kv_dtype(kv_dtype)
    layers = [m for m in model.modules() if is_cached_attention(m)]
    if not layers or not hasattr(getattr(model, "config", None), "_attn_implementation"):
        raise AttentionError(f"use_quantized_cache expects a transformers decoder whose attention layers have a "
                             f"layer_idx; found none in {type(model).__name__}.")
    for handle in getattr(model, _HOOKS, ()):
        handle.remove()
    model.set_attn_implementation(NAME)
    setattr(model, _HOOKS, [m.register_forward_pre_hook(_slot_hook(m.layer_idx, kv_dtype), with_kwargs=True)
                            for m in layers])
    return model
