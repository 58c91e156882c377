"""attend_cached: attention over what a cache hands its layer (the one place a layer's read of a cache goes).

    out = attend_cached(q, keys, values, mask, scale=, softcap=, sinks=, dropout=, backend=, causal=)

keys and values: tensors (a float cache), `Quantized` codes and scales (an int8 / fp8 cache), or a paged
cache's `PagedRead`. A paged decode step (at most MAX_ROWS new rows per sequence, all real, under the cache's
own mask, eager on the CPU, backend "auto", no dropout or gradient) reads the pages in place through the block
table (backends/cpu/paged.py); other paged calls gather the pages first. Float views go to mh.attention
(dispatch); quantized views to the quantized step (backends/decode_quant.py) directly: a STOPGAP until
dispatch takes a cache's kv forms itself (then this is a plain mh.attention call).
"""
from __future__ import annotations

import torch

from multihead.attention import attention
from multihead.backends.cpu.paged import decode_paged
from multihead.backends.decode import MAX_ROWS
from multihead.backends.decode_quant import quantized_attention
from multihead.caches.codec import Quantized
from multihead.caches.pages import PagedRead


def attend_cached(q: torch.Tensor, keys, values, mask, *, scale: float | None = None, softcap: float | None = None,
                  sinks: torch.Tensor | None = None, **options) -> torch.Tensor:
    """q (B, H, Lq, D) over a cache's keys (B, Hkv, Lk, D) and values (B, Hkv, Lk, Dv) -> (B, H, Lq, Dv)."""
    if isinstance(keys, PagedRead):
        if _in_place(q, keys, mask, options):
            cache = keys.cache
            (kp, ks), (vp, vs) = cache._pages_as_read(keys.part), cache._pages_as_read(values.part)
            return decode_paged(q, kp, vp, cache.block_table, cache.lengths, key_scales=ks, value_scales=vs,
                                scale=q.shape[-1] ** -0.5 if scale is None else scale, softcap=softcap, sinks=sinks)
        keys, values = keys.materialized(), values.materialized()
    if isinstance(keys, Quantized):
        return quantized_attention(q, keys, values, mask, scale=scale, softcap=softcap, sinks=sinks)
    return attention(q, keys, values, mask, scale=scale, softcap=softcap, sinks=sinks, **options)


def _in_place(q: torch.Tensor, keys: PagedRead, mask, options: dict) -> bool:
    """Whether the paged decode op serves this step as it is (see the module docstring)."""
    return (mask is not None and mask is keys.mask and q.shape[2] <= MAX_ROWS and q.device.type == "cpu"
            and q.dtype in (torch.float32, torch.bfloat16) and options.get("backend", "auto") == "auto"
            and not options.get("dropout") and not options.get("causal")
            and not (q.requires_grad and torch.is_grad_enabled()) and not torch.compiler.is_compiling())
