"""QuantizedLatentCache: the old name of an MLA LatentCache of int8 or fp8 (e4m3) codes, scales (B, 1, M, 2)."""
from __future__ import annotations

from multihead.caches.base import Coded
from multihead.caches.codec import check_kv_dtype
from multihead.caches.latent import LatentCache


class QuantizedLatentCache(LatentCache, metaclass=Coded):
    """LatentCache(..., kv_dtype=int8 or float8_e4m3fn); isinstance holds for any LatentCache with such a codec."""

    def __init__(self, batch_size: int, max_len: int, latent_dim: int, rope_dim: int, *, kv_dtype, **options):
        check_kv_dtype(kv_dtype)
        super().__init__(batch_size, max_len, latent_dim, rope_dim, kv_dtype=kv_dtype, **options)
