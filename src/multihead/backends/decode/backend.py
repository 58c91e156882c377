"""The decode backend: a few new query rows per sequence against a KV cache, on the CPU.

Runs `decode_step` (decode_step.py): the C++ kernel reads each kv head's keys and values once for all
its query heads, with an online softmax in fp32; where the kernel could not be built, the plain-torch
form of the same step. It takes the masks whose normal form is one interval of keys per query row
(lengths, causal, window, chunks) with at most one ALiBi, softcap and sinks, in float32 and bfloat16.
Inference only: it has no backward. Its plan (DecodePlan) serves every key length: it makes the rows'
intervals (decode_ranges.DecodeRows) for the call's key length and keeps the last ones, so a KV cache that
grows by a token a step plans once (`keys_from`) and a step at the same length makes nothing.
"""
from __future__ import annotations

import torch

from multihead.backends.capabilities import Capabilities
from multihead.backends.decode.ranges import RowsAtLength
from multihead.backends.common import sink_alone
from multihead.backends.decode.step import decode_step, describe_step
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot, declines

MAX_ROWS = 4  # query rows per sequence ("auto" leaves longer calls, prefills, to the other backends)
MIN_KEYS = 64  # below this many keys the step is too short for its set-up to pay off
DTYPES = (torch.float32, torch.bfloat16)


NO_ROWS = cannot("decode.empty", "no query rows")
MASK = cannot("decode.mask", "the decode step takes masks that keep one interval of keys per query row (lengths, "
                             "causal, window, chunks) and one ALiBi", any_length=True)
TOO_MANY_ROWS = declines("decode.rows", f"more than {MAX_ROWS} query rows per sequence: not a decode step")
TOO_FEW_KEYS = declines("decode.keys", f"fewer than {MIN_KEYS} keys: too few for the decode step's set-up to pay off")


class DecodePlan(RowsAtLength):
    """The rows' intervals of the key length met last, made again for a new one (a KV cache's next step)."""


class DecodeBackend:
    """Plan: a DecodePlan, each row's kept keys and ALiBi's positions and slopes at the call's key length."""

    name = "decode"
    reads_values = False  # its plan reads shapes and the form's structure; run reads the mask's values
    capabilities = Capabilities(devices=("cpu",), dtypes=DTYPES, dropout=False, backward=False, recorded=False,
                                lse=True)

    def plan(self, p: Problem, auto: bool = True):
        B, H, Lq, Lk = p.dims
        if Lq == 0:
            return NO_ROWS
        if not p.form.intervals_only:
            return MASK
        if auto and Lq > MAX_ROWS:
            return TOO_MANY_ROWS
        if auto and Lk < MIN_KEYS:
            return TOO_FEW_KEYS
        return DecodePlan(p)

    def keys_from(self, p: Problem, plan: DecodePlan, auto: bool) -> int:
        """The fewest keys from which `plan` serves this call at any key length: nothing else above reads Lk."""
        return MIN_KEYS if auto else 0

    def describe(self, p: Problem, plan: DecodePlan) -> str:
        B, H, Lq, Lk = p.dims
        return describe_step(p.q.dtype, f"{H // p.k.shape[1] * Lq} query rows per kv head")

    def run(self, p: Problem, plan: DecodePlan) -> torch.Tensor:
        contiguous = p.k.stride(-1) == 1 and p.v.stride(-1) == 1
        lo, hi, qpos, slopes = plan.rows(p)
        if p.lse:  # the kernel's log-sum-exp; a row with no key but a sink reports its sink (common.sink_alone)
            out, lse = decode_step(p.q, p.k, p.v, lo, hi, qpos, p.scale, p.softcap, slopes, p.sinks,
                                   use_kernel=contiguous, with_lse=True)
            return out, sink_alone(lse, p.sinks)
        return decode_step(p.q, p.k, p.v, lo, hi, qpos, p.scale, p.softcap, slopes, p.sinks, use_kernel=contiguous)
