"""`use_latent_cache(model)`: a transformers DeepSeek model decodes with multihead's MLA and latent caches.

    import multihead as mh, multihead.hf
    mh.hf.use_latent_cache(model)            # every DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention -> MLA
    mh.hf.use_latent_cache(model, kv_dtype=torch.int8)   # the latents as int8 codes (dense layers)
    model.generate(ids, max_new_tokens=32)   # same greedy tokens; each step reads the latents once

transformers' own layer caches the latent too, but re-expands every cached token through kv_b_proj at
each step (N × C × H × (Dn + Dv) multiply-adds per layer). The swapped layer attends over the latents
in absorbed form instead (one-token steps; prompts run naive).

How it meets transformers' cache: the model still owns the Cache object (a DynamicCache that generate
or the model makes, or one you pass). The first time a swapped layer sees it, it puts a `LatentLayer`
in that layer's slot: a cache layer that holds a multihead LatentCache (grown by doubling as tokens
come) and answers transformers' questions (sequence length, mask sizes, reset, beam reordering, batch
repetition and selection). Positions are the model's `position_ids` and the mask is the model's own
4-D mask (padding and causality), so left-padded batches work as in transformers.

DeepSeek V3.2 and GLM-MoE-DSA layers keep their lightning indexer's keys in the same LatentCache, and
attend to each query's top-k keys. GLM's decoder layers pass the keys a layer selected to the next one
(`prev_topk_indices`): its swapped layers return theirs, and its "shared" layers attend to them.
"""
from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

from multihead.convert.hf.config import hf_config
from multihead.convert.hf.latent import MODEL_TYPES, is_deepseek_attention
from multihead.errors import AttentionError
from multihead.hf.attention import as_mask
from multihead.layers.latent import MultiHeadLatentAttention
from multihead.caches.latent import LatentCache
from multihead.caches.quantized import check_kv_dtype

FIRST_CAPACITY = 64  # tokens per sequence in a new LatentCache; doubled whenever a call needs more


class LatentLayer(DynamicLayer):
    """One layer's slot in a transformers Cache, holding a multihead LatentCache (B, M, C) + (B, M, R)."""

    def __init__(self) -> None:
        super().__init__()
        self.latent: LatentCache | None = None

    def room_for(self, mla: MultiHeadLatentAttention, B: int, Lq: int, kv_dtype: torch.dtype | None = None) -> LatentCache:
        """The LatentCache (of kv_dtype codes when given), made or grown so that Lq more tokens fit."""
        if self.latent is None:
            self.latent = mla.new_cache(B, max(FIRST_CAPACITY, 2 * Lq), kv_dtype=kv_dtype)
            self.is_initialized = True
        needed = self.latent.held + Lq
        if needed > self.latent.max_len:
            self.latent = self.latent.resized(max_len=max(needed, 2 * self.latent.max_len))
        return self.latent

    def update(self, *args, **kwargs):
        raise AttentionError("this cache layer holds multihead latents; only a layer swapped by "
                             "multihead.hf.use_latent_cache can write to it.")

    def get_seq_length(self) -> int:
        return 0 if self.latent is None else self.latent.held

    def reset(self) -> None:
        self.latent, self.is_initialized = None, False

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.latent is not None:
            self.latent.reorder(beam_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.latent is not None:
            B = self.latent.keys.shape[0]
            self.latent = self.latent.resized(torch.arange(B).repeat_interleave(repeats))

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.latent is not None:
            self.latent = self.latent.resized(torch.as_tensor(indices).long())

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove:
            raise AttentionError("a latent cache cannot be cropped (assisted generation); generate without it.")

    def offload(self) -> None:  # the latents stay where they are
        return None

    def prefetch(self) -> None:
        return None


class LatentAttention(nn.Module):
    """Stands in for a DeepSeek attention layer: same call and return as transformers' layer.

    passes_indices: the layer returns the keys it attended to as a third value, and a shared layer reads
    the previous layer's from `prev_topk_indices` (GLM-MoE-DSA's decoder layers)."""

    def __init__(self, mla: MultiHeadLatentAttention, layer_idx: int, passes_indices: bool = False,
                 kv_dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.mla, self.layer_idx, self.passes_indices, self.kv_dtype = mla, layer_idx, passes_indices, kv_dtype
        self.is_causal = True

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None,
                cache: Cache | None = None, position_ids: torch.Tensor | None = None,
                prev_topk_indices: torch.Tensor | None = None, **kwargs):
        """hidden_states (B, Lq, E) -> ((B, Lq, E), None), at `position_ids` under the model's mask;
        ((B, Lq, E), None, indices (B, Lq, K)) when the layer passes its indices on."""
        mask = as_mask(self, attention_mask, True, None)
        positions = None if position_ids is None else position_ids.to(hidden_states.device)
        selection = {"indices": prev_topk_indices if self.mla.shared_selection else None,
                     "return_indices": self.passes_indices}
        if cache is None:
            out = self.mla(hidden_states, mask=mask, positions=positions, **selection)
        else:
            B, Lq, _ = hidden_states.shape
            latent = self._layer_of(cache).room_for(self.mla, B, Lq, self.kv_dtype)
            out = self.mla.attend_cached(hidden_states, latent, positions, mask, **selection)
        return (out[0], None, out[1]) if self.passes_indices else (out, None)

    def _layer_of(self, cache: Cache) -> LatentLayer:
        """This layer's LatentLayer in `cache`, put there on first use (the slot must still be empty)."""
        layers = cache.layers
        while len(layers) <= self.layer_idx:
            layers.append(DynamicLayer())
        layer = layers[self.layer_idx]
        if not isinstance(layer, LatentLayer):
            if not isinstance(layer, DynamicLayer) or layer.get_seq_length():
                raise AttentionError(f"layer {self.layer_idx}'s cache already holds {type(layer).__name__} states; "
                                     "a latent cache starts empty (generate again, or pass a new DynamicCache).")
            layer = layers[self.layer_idx] = LatentLayer()
        return layer


def use_latent_cache(model: nn.Module, *, kv_dtype: torch.dtype | None = None) -> nn.Module:
    """Swap every DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention layer of `model` for multihead's MLA with a
    latent cache; kv_dtype=torch.int8 or torch.float8_e4m3fn keeps the latents quantized
    (QuantizedLatentCache; dense layers only: a layer that selects keys raises AttentionError).

    Returns the model (changed in place). Raises AttentionError when it has no such layer.
    """
    if kv_dtype is not None:
        check_kv_dtype(kv_dtype)
    swaps = []  # every layer converted first: a refused call leaves the model as it was
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if is_deepseek_attention(child):
                ours = MultiHeadLatentAttention.from_module(child)
                passes = hf_config(child).model_type == "glm_moe_dsa"  # its decoder layers pass top-k on
                if kv_dtype is not None and ours.sparse:
                    raise AttentionError(f"use_latent_cache(kv_dtype={kv_dtype}) serves dense MLA layers; "
                                         f"{type(child).__name__} selects keys per query: use kv_dtype=None.")
                swaps.append((parent, name, LatentAttention(ours, child.layer_idx, passes, kv_dtype)))
    if not swaps:
        raise AttentionError(f"use_latent_cache expects a transformers DeepSeek model (model_type in "
                             f"{list(MODEL_TYPES)}); found no such attention layer in {type(model).__name__}.")
    for parent, name, layer in swaps:
        setattr(parent, name, layer)
    return model
