"""QuantizedKVCache: the old name of a KVCache of int8 or fp8 (e4m3) codes (the codec: caches/codec.py)."""
from __future__ import annotations

from multihead.caches.base import Coded
from multihead.caches.codec import KV_DTYPES, LARGEST, STORED, Quantized, check_kv_dtype, dequantized, quantize
from multihead.caches.kv import KVCache

__all__ = ["QuantizedKVCache", "Quantized", "KV_DTYPES", "LARGEST", "STORED", "check_kv_dtype", "dequantized",
           "quantize"]


class QuantizedKVCache(KVCache, metaclass=Coded):
    """KVCache(..., kv_dtype=int8 or float8_e4m3fn); isinstance holds for any KVCache with such a codec."""

    def __init__(self, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int, *, kv_dtype, **options):
        check_kv_dtype(kv_dtype)
        super().__init__(batch_size, max_len, num_kv_heads, head_dim, kv_dtype=kv_dtype, **options)
