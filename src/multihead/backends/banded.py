"""The banded backend: query blocks attend only to the keys their mask lets them see.

For a sliding window (`Mask.window(W) & Mask.causal()`), query block [i0, i1) can only see keys
[i0 - W + 1, i1). Each block runs SDPA on that span alone, with the rest of the mask evaluated on
the block, so the work is about Lq * (block + W) instead of Lq * Lk: it follows the window.

    scores of one block:  q[:, :, i0:i1] (B, H, Bq, D)  x  k[:, :, lo:hi] (B, Hkv, hi - lo, D)

The spans come from the mask's parts (`Part.key_span`) as host ints, from shapes alone: no values
are read, so this backend also runs under torch.compile. "auto" picks it when the spans skip at
least MIN_SKIPPED of the (Lq, Lk) grid.
"""
from __future__ import annotations

import torch

from multihead.backends.problem import Problem
from multihead.errors import AttentionError
from multihead.backends.scored import scored_note
from multihead.backends.sdpa import run_sdpa, score_variants_unsupported

MIN_SKIPPED = 0.6  # plain causal skips < 50%, which SDPA's is_causal already does without blocks
MIN_KEYS = 2048  # below this many keys one dense call is cheaper than several blocks
# Constant, not formatted with Lk: under torch.compile(dynamic=True) formatting a symbolic length
# would pin it, and every new length would then compile again.
TOO_FEW_KEYS = f"fewer than {MIN_KEYS} keys; one dense call is cheaper than blocks"
UNKNOWN_SPANS = "the key spans differ per sequence (bottom-right with Mask.lengths); the length-aware path takes those"


def block_size(Lq: int, span_hint: int) -> int:
    """Queries per block: about the window, at least 64, at most 512."""
    return max(64, min(512, span_hint, Lq))


def _blocks(p: Problem):
    """[(q_lo, q_hi, k_lo, k_hi)] for the problem's query blocks, or None when a span is unknown."""
    B, H, Lq, Lk = p.dims
    ix = p.index(rows_may_shift=True)
    last = p.mask.key_span(Lq - 1, Lq, ix)  # the last query sees a full window
    if last is None:
        return None, ix
    size = block_size(Lq, max(1, last[1] - last[0]))
    blocks = []
    for q_lo in range(0, Lq, size):
        q_hi = min(Lq, q_lo + size)
        span = p.mask.key_span(q_lo, q_hi, ix)
        if span is None:
            return None, ix
        blocks.append((q_lo, q_hi) + span)
    return blocks, ix


def _skipped(p: Problem, blocks) -> float:
    B, H, Lq, Lk = p.dims
    seen = sum((q_hi - q_lo) * (k_hi - k_lo) for q_lo, q_hi, k_lo, k_hi in blocks)
    return 1.0 - seen / (Lq * Lk) if Lq * Lk else 0.0


class BandedBackend:
    name = "banded"

    def unsupported(self, p: Problem) -> str | None:
        if p.mask is None:
            return "needs a mask that limits which keys each block of queries may see (e.g. Mask.window)"
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return f"the fused kernels need non-empty sequences; got Lq={Lq}, Lk={Lk}"
        return score_variants_unsupported(p)

    def declines(self, p: Problem) -> str | None:
        B, H, Lq, Lk = p.dims
        if Lk < MIN_KEYS:  # checked first: the common small call costs no span arithmetic
            return TOO_FEW_KEYS
        blocks = _blocks(p)[0]
        if blocks is None:
            return UNKNOWN_SPANS
        skipped = _skipped(p, blocks)
        if skipped < MIN_SKIPPED:
            return f"the blocks would skip only {skipped:.0%} of the (Lq, Lk) grid (needs {MIN_SKIPPED:.0%})"
        return None

    def describe(self, p: Problem) -> str:
        blocks, _ = _blocks(p)
        return (f"F.scaled_dot_product_attention per block of {blocks[0][1] - blocks[0][0]} queries on the keys "
                f"it may see ({len(blocks)} calls, {_skipped(p, blocks):.0%} of the (Lq, Lk) grid skipped)"
                + scored_note(p, "block"))

    def run(self, p: Problem) -> torch.Tensor:
        blocks, ix = _blocks(p)
        if blocks is None:
            raise AttentionError(f"backend 'banded' cannot run this call: {UNKNOWN_SPANS}.")
        outs = []
        for q_lo, q_hi, k_lo, k_hi in blocks:
            q = p.q[:, :, q_lo:q_hi]  # (B, H, Bq, D)
            if k_hi <= k_lo:  # this block sees no key: exact zeros, still connected to q
                outs.append(q.new_zeros(()).expand(*q.shape[:3], p.v.shape[-1]) + q[..., :1] * 0)
                continue
            k, v = p.k[:, :, k_lo:k_hi], p.v[:, :, k_lo:k_hi]  # (B, Hkv, span, D)
            outs.append(run_sdpa(q, k, v, p.mask, ix.block(q_lo, q_hi, k_lo, k_hi), p.dropout, p.scale, p.gqa))
        return torch.cat(outs, dim=2)  # (B, H, Lq, Dv)
