"""Cascade decoding: a prefix that several sequences share (through fork) is read once per step for all of
them, and merged with each sequence's own suffix by the log-sum-exp (mh.merge_states).

Shape legend: B sequences, H query heads, Hkv kv heads, Lq new queries per sequence, D head dim, P prefix
tokens (whole pages), S page_size.

    cache.fork(0, b) for every b ...               # the sequences share sequence 0's first P tokens' pages
    out = cascade_attention(q, cache, prefix=P)    # q (B, H, Lq, D) after this step's append -> (B, H, Lq, Dv)

The prefix is attended once for all sequences: each kv head's R = G * B * Lq query rows (its G query heads of
every sequence) share its keys, so for float pages (fp32/bf16) the prefix pass is two matrix products per kv
head over the prefix's pages, copied once per step into (P, D) rows (one read of the prefix, against B reads
unshared): scores = rows @ K^T, a log-sum-exp, then p @ V, in the pages' dtype with fp32 accumulation (bf16:
scores and p rounded to bf16, as a flash kernel rounds p). No gradient, as the decode kernel keeps none. Quantized pages (int8 / fp8) take the decode kernel's pass over
the pages in place (backends/cpu/paged.py, B * H heads over the Hkv kv heads). The suffixes are B sequences of
their own lengths read in place by the decode kernel; the merge by the log-sum-exp is exact. The prefix must
be whole pages that every sequence's block table shares.
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
    if q.requires_grad and torch.is_grad_enabled():
        raise AttentionError("cascade_attention is a decode step and keeps no gradient; q requires one. Call it under "
                             "torch.no_grad() or torch.inference_mode(), or attend with mh.attention for training.")
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
    rows = q.view(B, Hkv, G, Lq, D).permute(1, 2, 0, 3, 4)  # (Hkv, G, B, Lq, D): one prefix read
    if ks is None and vs is None:
        out_p, lse_p = _prefix_by_products(rows.reshape(Hkv, G * B * Lq, D), kp, vp, table[0, :n], options["scale"])
    else:
        one = torch.full((1, -(-(prefix + Lq) // S)), -1, dtype=table.dtype, device=table.device)
        one[0, :n] = table[0, :n]  # past the prefix: no page, so each row keeps exactly the prefix's keys
        out_p, lse_p = decode_paged(rows.reshape(1, Hkv * G * B, Lq, D), kp, vp, one,
                                    lengths.new_full((1,), prefix + Lq - 1), **options)
    out_p = out_p.view(Hkv, G, B, Lq, -1).permute(2, 0, 1, 3, 4).reshape(B, H, Lq, -1)
    lse_p = lse_p.view(Hkv, G, B, Lq).permute(2, 0, 1, 3).reshape(B, H, Lq)
    out_s, lse_s = decode_paged(q, kp, vp, table[:, n:], lengths - prefix, **options)
    out, _ = merge_states([(out_p, lse_p), (out_s, lse_s)])
    return out.to(q.dtype)


def _prefix_by_products(rows: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, pages: torch.Tensor,
                        scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rows (Hkv, R, D) against the float pages `pages` (n,) of kp (P, Hkv, S, D) / vp (P, Hkv, S, Dv), every
    row seeing every one of the n * S keys -> out (Hkv, R, Dv) float32, lse (Hkv, R) float32. One kv head at a
    time, so that its (R, n * S) scores stay in cache."""
    Hkv = rows.shape[0]
    keys, values = (_selected(p, pages) for p in (kp, vp))  # (n, Hkv, S, w) views or one copy
    rows = (rows.detach().float() * scale).to(kp.dtype)  # scaled once, in fp32; no gradient, as the kernel's
    outs, lses = [], []
    for h in range(Hkv):
        k, v = keys[:, h].flatten(0, 1), values[:, h].flatten(0, 1)  # (n * S, w): the head's prefix, one copy
        scores = (rows[h] @ k.T).float()  # (R, n * S), fp32 accumulation
        top = scores.amax(-1, keepdim=True)
        weights = scores.sub_(top).exp_()  # exp(s - max) <= 1, fp32
        total = weights.sum(-1, keepdim=True)
        outs.append((weights.to(kp.dtype) @ v).float() / total)
        lses.append((top + total.log()).squeeze(-1))
    return torch.stack(outs), torch.stack(lses)


def _selected(pool: torch.Tensor, pages: torch.Tensor) -> torch.Tensor:
    """The pages (n,) of pool (P, Hkv, S, w), (n, Hkv, S, w): pages written in order into fresh pages are one
    run, read in place as a slice; others are selected into one copy."""
    first = int(pages[0])
    run = bool((pages == torch.arange(first, first + len(pages), dtype=pages.dtype, device=pages.device)).all())
    return pool.narrow(0, first, len(pages)) if run else pool.index_select(0, pages)
