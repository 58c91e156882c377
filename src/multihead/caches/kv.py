"""KVCache: the keys and values a decoder has seen, one length per sequence (the keys-and-values layout).

Shape legend: B batch, Hkv key/value heads, M max_len, D head dim, Dv value head dim, Lq new tokens.

    cache = attn.new_cache(B, M)                        # keys (B, Hkv, M, D), values (B, Hkv, M, Dv), lengths (B,)
    cache = attn.new_cache(B, M, kv_dtype=torch.int8)   # codes, with key_scales, value_scales (B, Hkv, M) fp32
    cache = attn.new_cache(B, M, page_size=16)          # key_pages (P, Hkv, 16, D), ..., block_table (B, M / 16)
    y = attn(prompt, cache=cache); y = attn(next_token, cache=cache)

The new tokens of sequence b sit at positions lengths[b] ... lengths[b] + n_b - 1; a right-padded prompt
prefilled with `Mask.lengths(lens, query_lens=lens)` advances each sequence by its own length.
"""
from __future__ import annotations

import torch

from multihead.caches.base import BOTTOM_RIGHT, OVERFLOW, Cache, Part, positive
from multihead.caches.codec import codec_for

__all__ = ["KVCache", "BOTTOM_RIGHT", "OVERFLOW", "kv_parts"]


def kv_parts(num_kv_heads: int, head_dim: int, value_dim: int) -> tuple[Part, Part]:
    """The layout: a key (Hkv, D) and a value (Hkv, Dv) per token."""
    return (Part("keys", num_kv_heads, head_dim, "key_pages", "key_scales"),
            Part("values", num_kv_heads, value_dim, "value_pages", "value_scales"))


class KVCache(Cache):
    """Keys (B, Hkv, M, D), values (B, Hkv, M, Dv) and lengths (B,): buffers, not parameters. kv_dtype: int8 or
    float8_e4m3fn codes with fp32 scales (or a float dtype, as dtype=); page_size: paged storage."""

    pages_in_place = True  # append hands keys and values to attention as they are: paged, they stay pages

    def __init__(self, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int, *,
                 value_dim: int | None = None, kv_dtype: torch.dtype | None = None, page_size: int | None = None,
                 num_pages: int | None = None, device=None, dtype=None):
        positive("KVCache", num_kv_heads=num_kv_heads, head_dim=head_dim, value_dim=value_dim or head_dim)
        super().__init__(batch_size, max_len, kv_parts(num_kv_heads, head_dim, value_dim or head_dim),
                         codec=codec_for(kv_dtype, dtype), page_size=page_size, num_pages=num_pages, device=device)

    def append(self, k: torch.Tensor, v: torch.Tensor, new_tokens: torch.Tensor | None = None):
        """Write k (B, Hkv, Lq, D), v (B, Hkv, Lq, Dv) after each sequence's tokens.

        new_tokens (B,): how many of the Lq tokens are real per sequence (right padding); default Lq.
        Returns (keys, values, mask): the cached keys/values to attend to (tensors, or `Quantized` codes and
        scales) and the Mask that makes the attention causal within each sequence's own length.
        """
        (keys, values), mask = self.store((k, v), new_tokens)
        return keys, values, mask
