"""Cascade decoding: a prefix that several sequences share (through fork) is read once per step for all of
them, and merged with each sequence's own suffix by the log-sum-exp (mh.merge_states).

Shape legend: B sequences, H query heads, Hkv kv heads, Lq new queries per sequence, D head dim, P prefix
tokens (whole pages), S page_size.

    cache.fork(0, b) for every b ...               # the sequences share sequence 0's first P tokens' pages
    out = cascade_attention(q, cache, prefix=P)    # q (B, H, Lq, D) after this step's append -> (B, H, Lq, Dv)

The prefix is attended as one sequence whose query heads are every sequence's (B * H heads over the Hkv kv
heads: the decode kernel's G heads of a kv head share one pass over its pages), the suffixes as B sequences of
their own lengths; both read the pages in place through the block table (backends/cpu/paged.py, with the
log-sum-exp), and the merge is exact. The prefix must be whole pages that every sequence's block table shares.
"""
from __future__ import annotations

import torch

from multihead.backends.cpu.paged import decode_paged
from multihead.backends.merge import merge_states
from multihead.caches.base import Cache
from multihead.errors import AttentionError


def cascade_attention(q: torch.Tensor, cache: Cache, prefix: int, *, scale: float | None = None) -> torch.Tensor:
    """q (B, H, Lq, D) over a paged cache whose sequences share their first `prefix` tokens (see the module)."""
    B, H, Lq, D = q.shape
    S = cache.page_size
    if not cache.paged or prefix <= 0 or prefix % S or cache.batch_size != B or len(cache.parts) != 2:
        raise AttentionError(f"cascade_attention takes a paged KV cache for the batch of q and a shared prefix of "
                             f"whole pages (a positive multiple of page_size={S}); got prefix={prefix} on {cache!r}.")
    n, table, lengths = prefix // S, cache.block_table, cache.lengths
    if bool((table[:, :n] != table[:1, :n]).any()) or bool((table[:, :n] < 0).any()) or \
            int(lengths.min()) < prefix + Lq:
        raise AttentionError(f"cascade_attention: every sequence must share the same first {n} pages (fork them) "
                             f"and hold more than the prefix; block table rows differ or lengths "
                             f"{lengths.tolist()} are short.")
    (kp, ks), (vp, vs) = ((cache._pages_as_read(p)) for p in cache.parts)
    options = {"scale": D ** -0.5 if scale is None else scale, "key_scales": ks, "value_scales": vs,
               "return_lse": True}
    Hkv, G = kp.shape[1], H // kp.shape[1]
    rows = q.view(B, Hkv, G, Lq, D).permute(1, 2, 0, 3, 4).reshape(1, Hkv * G * B, Lq, D)  # one prefix read
    one = torch.full((1, -(-(prefix + Lq) // S)), -1, dtype=table.dtype, device=table.device)
    one[0, :n] = table[0, :n]  # past the prefix: no page, so each row keeps exactly the prefix's keys
    out_p, lse_p = decode_paged(rows, kp, vp, one, lengths.new_full((1,), prefix + Lq - 1), **options)
    out_p = out_p.view(Hkv, G, B, Lq, -1).permute(2, 0, 1, 3, 4).reshape(B, H, Lq, -1)
    lse_p = lse_p.view(Hkv, G, B, Lq).permute(2, 0, 1, 3).reshape(B, H, Lq)
    out_s, lse_s = decode_paged(q, kp, vp, table[:, n:], lengths - prefix, **options)
    out, _ = merge_states([(out_p, lse_p), (out_s, lse_s)])
    return out.to(q.dtype)
