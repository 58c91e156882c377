"""attend_cached: attention over what a cache hands its layer (the one place a layer's read of a cache goes).

    out = attend_cached(q, keys, values, mask, scale=, softcap=, sinks=, dropout=, backend=, causal=)

keys and values: tensors (a float cache), or `Quantized` codes and scales (an int8 / fp8 cache). Float views
go to mh.attention (dispatch). Quantized views go to the quantized step (backends/decode_quant.py) directly:
a STOPGAP until dispatch takes a cache's kv form itself (then this becomes a plain mh.attention call).
"""
from __future__ import annotations

import torch

from multihead.attention import attention
from multihead.backends.decode_quant import quantized_attention
from multihead.caches.codec import Quantized


def attend_cached(q: torch.Tensor, keys, values, mask, *, scale: float | None = None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None, **options) -> torch.Tensor:
    """q (B, H, Lq, D) over a cache's keys (B, Hkv, Lk, D) and values (B, Hkv, Lk, Dv) -> (B, H, Lq, Dv)."""
    if isinstance(keys, Quantized):
        return quantized_attention(q, keys, values, mask, scale=scale, softcap=softcap, sinks=sinks)
    return attention(q, keys, values, mask, scale=scale, softcap=softcap, sinks=sinks, **options)
