"""Cascade decoding: a prefix that several sequences share (through fork) is read once per step for all of
them, and merged with each sequence's own suffix by the log-sum-exp (mh.merge_states).

Shape legend: B sequences, H query heads, Hkv kv heads, Lq new queries per sequence, D head dim, P prefix
tokens (whole pages), S page_size.

    cache.fork(0, b) for every b ...               # the sequences share sequence 0's first P tokens' pages
    out = cascade_attention(q, cache, prefix=P)    # q (B, H, Lq, D) after this step's append -> (B, H, Lq, Dv)

The prefix is attended as one sequence with B * Lq query rows (every row sees every prefix key: they all
come after it), the suffixes as B sequences of their own lengths, causal bottom-right. Both give (out, lse);
the merge is exact. The prefix must be whole pages that every sequence's block table shares (checked).

The (out, lse) of each part comes from mh.attention(..., return_lse=True): dispatch picks the backend.
"""
from __future__ import annotations

import torch

from multihead.attention import attention
from multihead.backends.merge import merge_states
from multihead.caches.base import Cache
from multihead.errors import AttentionError
from multihead.masks import Mask


def cascade_attention(q: torch.Tensor, cache: Cache, prefix: int, *, scale: float | None = None) -> torch.Tensor:
    """q (B, H, Lq, D) over a paged float cache whose sequences share their first `prefix` tokens (see module)."""
    B, H, Lq, D = q.shape
    S = cache.page_size
    if not cache.paged or cache.codec.quantized or prefix <= 0 or prefix % S or cache.batch_size != B:
        raise AttentionError(f"cascade_attention takes a paged float cache for the batch of q and a shared prefix "
                             f"of whole pages (a positive multiple of page_size={S}); got prefix={prefix} on {cache!r}.")
    n = prefix // S
    table = cache.block_table[:, :n]
    lengths = cache.lengths
    if bool((table != table[:1]).any()) or bool((table < 0).any()) or int(lengths.min()) < prefix + Lq:
        raise AttentionError(f"cascade_attention: every sequence must share the same first {n} pages (fork them) "
                             f"and hold more than the prefix; block table rows differ or lengths "
                             f"{lengths.tolist()} are short.")
    scale = D ** -0.5 if scale is None else scale
    keys, values = cache.parts[0], cache.parts[1] if len(cache.parts) > 1 else cache.parts[0]
    first = table[0]
    whole = bool((first[1:] - first[:-1] == 1).all()) if n > 1 else True  # pages in a row of the pool: a view
    prefix_kv = [_prefix_rows(getattr(cache, p.pages), first, whole) for p in (keys, values)]  # (1, Hkv, P, D)
    rows = q.permute(1, 2, 0, 3).reshape(1, H, Lq * B, D)  # every sequence's queries, one prefix read
    out_p, lse_p = attention(rows, *prefix_kv, scale=scale, return_lse=True)
    out_p = out_p.view(H, Lq, B, -1).permute(2, 0, 1, 3)
    lse_p = lse_p.view(H, Lq, B).permute(2, 0, 1)
    longest = int(lengths.max())
    suffix = [cache._gathered(p.pages, longest, n) for p in (keys, values)]  # (B, Hkv, Ls, D): own pages
    j = torch.arange(longest - prefix, device=q.device)
    last = (lengths - prefix)[:, None] - Lq + torch.arange(Lq, device=q.device)  # (B, Lq) each query's position
    keep = (j <= last[..., None])[:, None]  # (B, 1, Lq, Ls): causal, bottom-right per sequence
    out_s, lse_s = attention(q, *suffix, Mask.keep(keep), scale=scale, return_lse=True)
    out, _ = merge_states([(out_p, lse_p), (out_s, lse_s)])
    return out.to(q.dtype)


def _prefix_rows(pages: torch.Tensor, first: torch.Tensor, whole: bool) -> torch.Tensor:
    """(1, Hkv, n * S, D): the prefix's pages as one sequence (a view when they lie in a row of the pool)."""
    n = first.shape[0]
    rows = pages[int(first[0]):int(first[0]) + n] if whole else pages[first.long()]  # (n, Hkv, S, D)
    return rows.transpose(0, 1).reshape(1, rows.shape[1], n * rows.shape[2], rows.shape[3])
