"""A new cache layout is one file: here a toy one, keys that are also the values (one K = V head per kv head),
written as a user would, gets contiguous and paged storage, int8/fp8 codes, fork, reorder and the checks
from the cache family's base."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.caches.base import Cache, Part
from multihead.caches.codec import codec_for


class KeysAreValuesCache(Cache):
    """The whole layout: one part, (B, Hkv, M, D) keys that attention also reads as values."""

    def __init__(self, batch_size, max_len, heads, dim, *, kv_dtype=None, page_size=None, dtype=None):
        super().__init__(batch_size, max_len, (Part("keys", heads, dim, "key_pages", "key_scales"),),
                         codec=codec_for(kv_dtype, dtype), page_size=page_size)

    def append(self, k: torch.Tensor, new_tokens=None):
        (keys,), mask = self.store((k,), new_tokens)
        return keys, keys, mask


@pytest.mark.parametrize("page_size", [None, 4])
@pytest.mark.parametrize("kv_dtype, tol", [(None, 1e-5), (torch.int8, 2e-2), (torch.float8_e4m3fn, 8e-2)],
                         ids=["float", "int8", "fp8"])
def test_a_toy_layout_decodes_like_attention_over_its_rows(page_size, kv_dtype, tol):
    g = torch.Generator().manual_seed(0)
    B, Hkv, L, D = 2, 2, 24, 16
    rows = torch.randn(B, Hkv, L, D, generator=g)
    q = torch.randn(B, 4, L, D, generator=g)
    cache = KeysAreValuesCache(B, 32, Hkv, D, kv_dtype=kv_dtype, page_size=page_size)
    outs = []
    with torch.no_grad():
        keys, values, mask = cache.append(rows[:, :, :16])
        outs.append(mh.attention(q[:, :, :16], keys, values, mask))
        for t in range(16, L):
            keys, values, mask = cache.append(rows[:, :, t:t + 1])
            outs.append(mh.attention(q[:, :, t:t + 1], keys, values, mask))
    want = mh.attention(q.double(), rows.double(), rows.double(), mh.Mask.causal())
    got = torch.cat(outs, 2).double()
    assert (got - want).abs().max() <= tol * want.abs().max()
    assert cache.memory_bytes() == (cache.pages_in_use() * 4 if page_size else 32) * B ** (page_size is None) * \
        cache.bytes_per_token()
    cache.reorder(torch.tensor([1, 1]))
    cache.fork(0, 1, length=5)
    assert cache.lengths.tolist() == [L, 5] and "codec=" in repr(cache)
    with pytest.raises(mh.AttentionError, match="max_len=32"):
        cache.append(rows[:, :, :9])
