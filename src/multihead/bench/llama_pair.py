"""One Llama attention layer twice: transformers' LlamaAttention and ours, with identical weights.

Shapes: B batch, L context, E hidden size, H heads, Hkv kv heads, D head dim (E = H * D here).

    pair = LlamaPair.build(hidden=4096, heads=32, kv_heads=8, head_dim=128, dtype=torch.bfloat16)
    pair.fill(context)            # context (B, L, E): both caches hold its rotated keys and values
    pair.ours_step(x)             # x (B, 1, E): one decode step through MultiHeadAttention + KVCache
    pair.hf_step(x)               # the same step through LlamaAttention + DynamicCache
    pair.hf_static_eager_step(x)  # the same through LlamaAttention + StaticCache, eager
    pair.hf_static_step(x)        # the same through LlamaAttention + StaticCache, torch.compile'd
    pair.recompute(full)          # full (B, L + 1, E): our module over the whole sequence, causal

`MultiHeadAttention.from_module` converts the HF layer: its weights, and a RoPE built from the config's
rope parameters. HF runs its SDPA attention (`attn_implementation="sdpa"`) and computes
its rotary cos/sin with LlamaRotaryEmbedding on every step, as its decoder does once per step. Each HF
step passes its cache as `cache=` (the keyword transformers 5.x takes; `past_key_values` goes in 5.40).

Which HF call is fastest depends on how transformers' SDPA integration meets grouped heads (GQA_UNDER_COMPILE).
Both caches are filled with the same keys and values, the ones a prefill writes: the context's
projections, keys turned to their positions. Filling them that way costs two projections instead of
a whole prefill forward, which at long contexts takes as long as the recompute itself.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from multihead.caches.kv import KVCache
from multihead.layers.multi_head import MultiHeadAttention
from multihead.positions import apply_rotary

GQA_UNDER_COMPILE = (
    "with its DynamicCache and no mask, transformers' SDPA call passes enable_gqa; eager with a StaticCache "
    "(whose mask covers its free slots) it folds the query heads of each kv head into rows (pack_gqa), "
    "reading each kv head once; under torch.compile it skips that fold and, with a mask, cannot pass "
    "enable_gqa, so it repeats K and V for every query head over all the cache's slots at every step "
    "(repeat_kv: H / Hkv times the cache's bytes, written into fresh buffers, then read): the compiled "
    "StaticCache step is then the slowest of the three")


@dataclass
class LlamaPair:
    hf: nn.Module  # LlamaAttention
    rotary: nn.Module  # LlamaRotaryEmbedding
    ours: MultiHeadAttention
    hf_cache: object = None  # DynamicCache
    our_cache: KVCache | None = None
    static_cache: object = None  # StaticCache of max_len L + headroom, for the compiled step
    eager_static_cache: object = None  # the same, for the eager step
    compiled_static: object = None  # torch.compile of `_static_step`, made on first use

    @classmethod
    def build(cls, hidden: int, heads: int, kv_heads: int, head_dim: int, *, dtype: torch.dtype,
              max_position: int, seed: int = 0) -> LlamaPair:
        """Both layers in eval mode, in `dtype`, with the same random weights (HF's own init)."""
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding

        config = LlamaConfig(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=kv_heads,
                             head_dim=head_dim, intermediate_size=4, num_hidden_layers=1, vocab_size=4,
                             max_position_embeddings=max_position, attention_bias=False)
        config._attn_implementation = "sdpa"
        torch.manual_seed(seed)
        hf = LlamaAttention(config, layer_idx=0).to(dtype).eval()
        ours = MultiHeadAttention.from_module(hf).eval()  # the Llama converter: weights, RoPE, causal
        return cls(hf, LlamaRotaryEmbedding(config), ours)

    def fill(self, context: torch.Tensor, headroom: int) -> None:
        """Fresh caches holding the keys and values of context (B, L, E), with room for `headroom` more
        tokens in ours (HF's DynamicCache grows by concatenation)."""
        from transformers import DynamicCache, StaticCache

        B, L, _ = context.shape
        Hkv, D = self.ours.num_kv_heads, self.ours.head_dim
        with torch.no_grad():
            k = self.ours.k_proj(context).view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
            v = self.ours.v_proj(context).view(B, L, Hkv, D).transpose(1, 2)  # (B, Hkv, L, D)
            cos, sin = self.ours.rope.cos_sin(torch.arange(L), k.dtype)  # (1, L, D)
            k = apply_rotary(k, cos, sin, self.ours.rope.interleaved)
            self.our_cache = self.ours.new_cache(B, L + headroom)
            self.our_cache.append(k, v)
            self.hf_cache = DynamicCache()
            self.hf_cache.update(k.clone(), v.clone(), 0)
            self.static_cache, self.eager_static_cache = (
                StaticCache(config=self.hf.config, max_cache_len=L + headroom) for _ in range(2))
            for cache in (self.static_cache, self.eager_static_cache):
                cache.update(k.clone(), v.clone(), 0)

    def ours_step(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, 1, E) -> (B, 1, E), appended to our cache."""
        return self.ours(x, cache=self.our_cache)

    def hf_step(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, 1, E) -> (B, 1, E) through LlamaAttention, appended to its DynamicCache."""
        position = torch.full((x.shape[0], 1), self.hf_cache.get_seq_length(), dtype=torch.long)
        out, _ = self.hf(x, position_embeddings=self.rotary(x, position), attention_mask=None, cache=self.hf_cache)
        return out

    def hf_static_eager_step(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, 1, E) -> (B, 1, E) through LlamaAttention and a StaticCache, eager."""
        return self._static_step(self.eager_static_cache, x)

    def hf_static_step(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, 1, E) -> (B, 1, E) through LlamaAttention and its StaticCache, compiled with torch.compile
        (default mode) as a user who wants speed runs it; the first call compiles."""
        if self.compiled_static is None:
            self.compiled_static = torch.compile(self._static_step)
        return self.compiled_static(self.static_cache, x)

    def _static_step(self, cache, x: torch.Tensor) -> torch.Tensor:
        """One step on a StaticCache: the position and the mask over its M slots come from its length
        tensor, so every step has the same shapes (no recompiles)."""
        length = cache.layers[0].cumulative_length  # () tensor: tokens cached so far
        slots = cache.layers[0].keys.shape[2]
        position = length.view(1, 1).expand(x.shape[0], 1)
        mask = (torch.arange(slots) <= length).view(1, 1, 1, slots)  # (1, 1, 1, M): cached slots and this one
        out, _ = self.hf(x, position_embeddings=self.rotary(x, position), attention_mask=mask, cache=cache)
        return out

    def recompute(self, full: torch.Tensor) -> torch.Tensor:
        """full (B, L + 1, E) -> (B, L + 1, E): our module over the whole sequence, no cache, causal."""
        return self.ours(full, causal=True)
