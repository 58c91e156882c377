"""Attention block by block: each block of keys gives a partial output and its log-sum-exp, and the
partials merge exactly into the full softmax. This is the idea behind flash attention (blocks that fit
in fast memory) and ring attention (blocks held by different devices).

Shapes: B batch, H heads, Lq queries, Lk keys (cut into blocks of Lb), D head dim.
"""
from __future__ import annotations

import functools
import math

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic


def block_partial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  keep: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of q (B, H, Lq, D) over one block of keys k, v (B, H, Lb, D) alone.

    Returns (out, lse): out (B, H, Lq, D) is the softmax-weighted sum over this block only, and
    lse (B, H, Lq, 1) = log Σ_j exp(score_j) over the block. keep (Lq, Lb), True = may attend; a
    query that keeps no key of the block gets out = 0 and lse = -inf (the block has no say for it).
    """
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # (B, H, Lq, Lb)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    top = scores.amax(-1, keepdim=True)                             # (B, H, Lq, 1)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))   # a fully blocked row: no shift
    p = torch.exp(scores - top)                                     # each block subtracts its own max
    total = p.sum(-1, keepdim=True)                                 # (B, H, Lq, 1)
    out = (p @ v) / torch.where(total > 0, total, torch.ones_like(total))
    return out, top + torch.log(total)                              # log(0) = -inf for a blocked row


def merge(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Two partials (out, lse) -> the partial of both blocks together: weight each out by its share
    exp(lse_part - lse_both) of the total, where lse_both = logaddexp(lse_a, lse_b)."""
    (out_a, lse_a), (out_b, lse_b) = a, b
    lse = torch.logaddexp(lse_a, lse_b)
    safe = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))   # both blocks blocked: out stays 0
    return torch.exp(lse_a - safe) * out_a + torch.exp(lse_b - safe) * out_b, lse


def blocks(Lk: int, size: int) -> list[slice]:
    """The key blocks 0..size-1, size..2*size-1, ... (the last one may be shorter)."""
    return [slice(start, min(start + size, Lk)) for start in range(0, Lk, size)]


def blockwise_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, size: int,
                        keep: torch.Tensor | None = None, order: list[int] | None = None):
    """Attention computed one key block at a time and merged left to right (a running merge, as flash
    attention does), blocks taken in `order` (default: first to last). Returns (out, lse)."""
    cuts = blocks(k.shape[-2], size)
    parts = [block_partial(q, k[..., c, :], v[..., c, :], None if keep is None else keep[:, c]) for c in cuts]
    return functools.reduce(merge, [parts[i] for i in (order or range(len(parts)))])


def block_shares(q: torch.Tensor, k: torch.Tensor, size: int) -> torch.Tensor:
    """exp(lse_block - lse_all) for each block (n_blocks, B, H, Lq): how much of each query's weight
    falls in each block."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])   # (B, H, Lq, Lk)
    total = torch.logsumexp(scores, -1)
    return torch.stack([torch.exp(torch.logsumexp(scores[..., c], -1) - total) for c in blocks(k.shape[-2], size)])


def naive_softmax_overflows(scores: torch.Tensor) -> bool:
    """exp(scores) / Σ exp(scores) without subtracting the max: True when it breaks (inf or NaN)."""
    e = torch.exp(scores)
    return not bool(torch.isfinite(e / e.sum(-1, keepdim=True)).all())


@topic("lse-merge")
def lse_merge(story: Story, say: Say) -> None:
    g = torch.Generator().manual_seed(0)
    B, H, Lq, Lk, D, size = 1, 2, 4, 10, 8, 4
    q, k, v = (torch.randn(B, H, n, D, generator=g, dtype=torch.float64) for n in (Lq, Lk, Lk))
    full = mh.attention(q, k, v, backend="math")                   # (B, H, Lq, D), the whole softmax at once
    say.text("text.idea")
    say.code("code.partial")
    say.code("code.merge")

    say.heading("heading.exact")
    out, lse = blockwise_attention(q, k, v, size)
    shares = block_shares(q, k, size)                               # (n_blocks, B, H, Lq)
    rows = [[f"{c.start}..{c.stop - 1}", *(f"{s:.3f}" for s in shares[i, 0, 0].tolist())]
            for i, c in enumerate(blocks(Lk, size))]
    story.table([say("label.keys"), *(say("label.query", i=i) for i in range(Lq))], rows,
                title=say("label.shares", size=size, Lk=Lk))
    say.check("check.merge-equals-full", max_diff(out, full) < 1e-12, diff_text(out, full))
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)
    say.check("check.lse-is-full-lse", max_diff(lse[..., 0], torch.logsumexp(scores, -1)) < 1e-12,
              diff_text(lse[..., 0], torch.logsumexp(scores, -1)))
    say.check("check.shares-sum-to-one", max_diff(shares.sum(0), torch.ones(B, H, Lq)) < 1e-12)
    plain_mean = torch.stack([block_partial(q, k[..., c, :], v[..., c, :])[0] for c in blocks(Lk, size)]).mean(0)
    say.check("check.mean-is-wrong", max_diff(plain_mean, full) > 1e-3, diff_text(plain_mean, full))
    backwards, _ = blockwise_attention(q, k, v, size, order=[2, 1, 0])
    say.check("check.any-order", max_diff(backwards, full) < 1e-12, diff_text(backwards, full))

    say.heading("heading.masked")
    keep = torch.ones(Lq, Lk, dtype=torch.bool).tril(diagonal=Lk - Lq)   # causal, queries at the end
    masked, _ = blockwise_attention(q, k, v, 3, keep=keep)
    reference = mh.attention(q, k, v, mask=mh.Mask.keep(keep), backend="math")
    blind = sum(int((~keep[:, c]).all(-1).sum()) for c in blocks(Lk, 3))   # (query, block) pairs that see nothing
    say.check("check.masked-blocks", max_diff(masked, reference) < 1e-12 and blind > 0,
              diff_text(masked, reference), n=blind)

    say.heading("heading.large")
    big = 40.0
    q32, k32, v32 = (t.float() for t in (q * big, k, v))
    scores32 = q32 @ k32.transpose(-2, -1) / math.sqrt(D)
    say.check("check.naive-overflows", naive_softmax_overflows(scores32),
              say("detail.largest-score", top=scores32.max().item()))
    out32, _ = blockwise_attention(q32, k32, v32, size)
    exact = mh.attention(q * big, k, v, backend="math")
    say.check("check.blocks-stay-finite", bool(torch.isfinite(out32).all()) and max_diff(out32, exact) < 1e-5,
              diff_text(out32, exact))
    say.text("text.flash-and-ring")
