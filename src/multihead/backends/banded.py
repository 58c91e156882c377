"""The banded backend: query blocks attend only to the keys their mask lets them see.

For a sliding window (`Mask.window(W) & Mask.causal()`), query block [i0, i1) can only see keys
[i0 - W + 1, i1). Each block runs SDPA on that span alone, with the rest of the mask evaluated on
the block, so the work is about Lq * (block + W) instead of Lq * Lk: it follows the window.

    scores of one block:  q[:, :, i0:i1] (B, H, Bq, D)  x  k[:, :, lo:hi] (B, Hkv, hi - lo, D)

The spans come from the normal form's interval formula (`NormalForm.span`) on host ints, from shapes
alone: no values
are read, so this backend also runs under torch.compile when asked for by name (one graph per length).
"auto" picks it in eager mode when there are at least min_keys(device type) keys and the spans skip
at least MIN_SKIPPED of the (Lq, Lk) grid; under torch.compile it leaves the call to one dense or
Flex call, which compiles once for every length.
"""
from __future__ import annotations

import torch

from multihead.backends.capabilities import Capabilities
from multihead.backends.common import connected_zeros, score_variants_unsupported
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot, declines
from multihead.backends.sdpa_args import run_on_grid, scored_note

MIN_SKIPPED = 0.6  # plain causal skips < 50%, which SDPA's is_causal already does without blocks
# below this many keys one dense call is cheaper than several blocks, per device type
MIN_KEYS_BY_DEVICE = {"cpu": 2048, "cuda": 2048}
MIN_KEYS = 2048  # any other device


def min_keys(device_type: str) -> int:
    """The fewest keys for which "auto" cuts blocks on this device type."""
    return MIN_KEYS_BY_DEVICE.get(device_type, MIN_KEYS)


def _skipped_words(p: Problem) -> str:
    blocks, _ = _blocks(p)
    return f"the blocks would skip only {_skipped(p, blocks):.0%} of the (Lq, Lk) grid (needs {MIN_SKIPPED:.0%})"


NEEDS_SPANS = cannot("banded.needs-spans", "needs a mask that limits which keys each block of queries may see "
                                           "(e.g. Mask.window)")
UNKNOWN_SPANS = cannot("banded.unknown-spans", "the key spans differ per sequence (bottom-right with "
                                               "Mask.lengths); the length-aware path takes those")
COMPILING = declines("banded.compiling", "under torch.compile blocks cut at the lengths would compile a new graph "
                                         "per length; one call serves every length (flex's BlockMask skips the "
                                         "same blocks on CUDA)")
TOO_FEW_KEYS = declines("banded.too-few-keys", lambda p: f"fewer than {min_keys(p.q.device.type)} keys; one dense "
                                                         "call is cheaper than blocks")
TOO_LITTLE_SKIPPED = declines("banded.too-little-skipped", _skipped_words)


def block_size(Lq: int, span_hint: int) -> int:
    """Queries per block: about the window, at least 64, at most 512."""
    return max(64, min(512, span_hint, Lq))


def _blocks(p: Problem):
    """([(q_lo, q_hi, k_lo, k_hi)] for the problem's query blocks, or None when a span is unknown; the grid)."""
    B, H, Lq, Lk = p.dims
    ix = p.index(rows_may_shift=p.sinks is None)  # sinks count per-row constants
    last = p.form.span(Lq - 1, Lq, Lq, Lk)  # the last query sees a full window
    if last is None:
        return None, ix
    size = block_size(Lq, max(1, last[1] - last[0]))
    blocks = []
    for q_lo in range(0, Lq, size):
        q_hi = min(Lq, q_lo + size)
        span = p.form.span(q_lo, q_hi, Lq, Lk)
        if span is None:
            return None, ix
        blocks.append((q_lo, q_hi) + span)
    return blocks, ix


def _skipped(p: Problem, blocks) -> float:
    B, H, Lq, Lk = p.dims
    seen = sum((q_hi - q_lo) * (k_hi - k_lo) for q_lo, q_hi, k_lo, k_hi in blocks)
    return 1.0 - seen / (Lq * Lk) if Lq * Lk else 0.0


class BandedBackend:
    """Plan: (blocks [(q_lo, q_hi, k_lo, k_hi)], the whole grid's Index)."""

    name = "banded"
    capabilities = Capabilities(empty=False)

    def plan(self, p: Problem, auto: bool = True):
        if len(p.form.parts) == 0:
            return NEEDS_SPANS
        B, H, Lq, Lk = p.dims
        variants = score_variants_unsupported(p)
        if variants is not None:
            return variants
        if auto:
            if torch.compiler.is_compiling():  # before any comparison of a length: no guard on it
                return COMPILING
            if Lk < min_keys(p.q.device.type):  # the common small call costs no span arithmetic
                return TOO_FEW_KEYS
        blocks, ix = _blocks(p)
        if blocks is None:
            return UNKNOWN_SPANS
        if auto and _skipped(p, blocks) < MIN_SKIPPED:
            return TOO_LITTLE_SKIPPED
        return blocks, ix

    def describe(self, p: Problem, plan) -> str:
        blocks, _ = plan
        return (f"F.scaled_dot_product_attention per block of {blocks[0][1] - blocks[0][0]} queries on the keys "
                f"it may see ({len(blocks)} calls, {_skipped(p, blocks):.0%} of the (Lq, Lk) grid skipped)"
                + scored_note(p, "block"))

    def run(self, p: Problem, plan) -> torch.Tensor:
        blocks, ix = plan
        outs = []
        for q_lo, q_hi, k_lo, k_hi in blocks:
            q = p.q[:, :, q_lo:q_hi]  # (B, H, Bq, D)
            if k_hi <= k_lo:  # this block sees no key: exact zeros (NaN in q too), still connected to q
                outs.append(connected_zeros((*q.shape[:3], p.v.shape[-1]), p.v.dtype, q, p.k, p.v))
                continue
            k, v = p.k[:, :, k_lo:k_hi], p.v[:, :, k_lo:k_hi]  # (B, Hkv, span, D)
            outs.append(run_on_grid(q, k, v, p.form, ix.block(q_lo, q_hi, k_lo, k_hi), p.dropout, p.scale, p.gqa,
                                    p.sinks))
        return torch.cat(outs, dim=2)  # (B, H, Lq, Dv)
