"""QuantizedLatentCache: an MLA LatentCache of int8 or fp8 (e4m3) codes, under its own name.

    cache = mla.new_cache(B, max_len, kv_dtype=torch.int8)   # or torch.float8_e4m3fn
    keys (B, 1, M, C + R): codes of [latent | rotary key]; scales (B, 1, M, 2): the latent's, the key's
"""
from __future__ import annotations

import torch

from multihead.caches.codec import check_kv_dtype
from multihead.caches.base import Coded
from multihead.caches.latent import LatentCache


class QuantizedLatentCache(LatentCache, metaclass=Coded):
    """LatentCache(..., kv_dtype=int8 or float8_e4m3fn): latents and rotary keys come in `dtype`."""

    def __init__(self, batch_size: int, max_len: int, latent_dim: int, rope_dim: int, *, kv_dtype: torch.dtype,
                 **options):
        check_kv_dtype(kv_dtype)
        super().__init__(batch_size, max_len, latent_dim, rope_dim, kv_dtype=kv_dtype, **options)
