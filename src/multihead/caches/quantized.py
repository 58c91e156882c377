"""QuantizedKVCache: a KVCache of int8 or fp8 (e4m3) codes, under its own name (the codec is caches/codec.py).

    cache = attn.new_cache(B, max_len, kv_dtype=torch.int8)   # or torch.float8_e4m3fn
    keys (B, Hkv, M, D) and values (B, Hkv, M, Dv): the codes; key_scales, value_scales (B, Hkv, M) fp32
"""
from __future__ import annotations

import torch

from multihead.caches.codec import KV_DTYPES, LARGEST, STORED, Quantized, check_kv_dtype, dequantized, quantize
from multihead.caches.base import Coded
from multihead.caches.kv import KVCache

__all__ = ["QuantizedKVCache", "Quantized", "KV_DTYPES", "LARGEST", "STORED", "check_kv_dtype", "dequantized",
           "quantize"]


class QuantizedKVCache(KVCache, metaclass=Coded):
    """KVCache(..., kv_dtype=int8 or float8_e4m3fn): appended keys and values come in `dtype` (the model's)."""

    def __init__(self, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int, *, kv_dtype: torch.dtype,
                 **options):
        check_kv_dtype(kv_dtype)
        super().__init__(batch_size, max_len, num_kv_heads, head_dim, kv_dtype=kv_dtype, **options)
