"""new_cache: the one path from a layer to its cache (every layer's `new_cache` calls it).

    layer.new_cache(batch_size, max_len, *, dtype=None, kv_dtype=None, page_size=None, num_pages=None)

dtype: what the layer hands the cache (default: its weight's; float32 for a quantized Linear). kv_dtype: None,
a float dtype (the same as dtype=), or int8 / float8_e4m3fn codes with fp32 scales. page_size: paged storage
of that many tokens a page, in a pool of num_pages pages (default: room for every sequence at max_len).
"""
from __future__ import annotations

import torch

from multihead.caches.base import Cache
from multihead.caches.codec import FLOATS
from multihead.errors import AttentionError


def new_cache(kind: type[Cache], weight, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None,
              kv_dtype: torch.dtype | None = None, page_size: int | None = None, num_pages: int | None = None,
              **layout) -> Cache:
    """A `kind` cache on `weight`'s device for batch_size sequences of up to max_len tokens (see the module)."""
    weight = weight() if callable(weight) else weight  # a dynamically quantized Linear's weight is a method
    quantized = kv_dtype is not None and kv_dtype not in FLOATS
    if not kind.pageable and (quantized or page_size is not None or num_pages is not None):
        raise AttentionError(f"a {kind.__name__} keeps its own windowed form: it takes no int8/fp8 kv_dtype, "
                             f"page_size or num_pages; got kv_dtype={kv_dtype}, page_size={page_size}, "
                             f"num_pages={num_pages}.")
    if dtype is None and (quantized or kv_dtype is None):
        dtype = weight.dtype if weight.is_floating_point() else torch.float32
    options = {"kv_dtype": kv_dtype, "page_size": page_size, "num_pages": num_pages} if kind.pageable else {}
    if not kind.pageable and kv_dtype is not None:
        dtype = dtype or kv_dtype
    return kind(batch_size, max_len, **layout, **options, device=weight.device, dtype=dtype)
