"""The decode backend: a few new query rows per sequence against a KV cache, on the CPU.

Runs `decode_step` (decode_step.py): the C++ kernel reads each kv head's keys and values once for all
its query heads, with an online softmax in fp32; where the kernel could not be built, the plain-torch
form of the same step. It takes the masks a decode step carries (lengths, causal, window, ALiBi),
softcap and sinks, in float32 and bfloat16. Inference only: it has no backward.
"""
from __future__ import annotations

import torch

from multihead.backends.decode_build import unavailable
from multihead.backends.decode_step import decode_step, key_ranges, unsupported_mask
from multihead.backends.flex import needs_grad
from multihead.backends.problem import Problem

MAX_ROWS = 4  # query rows per sequence ("auto" leaves longer calls, prefills, to the other backends)
MIN_KEYS = 64  # below this many keys the step is too short for its set-up to pay off
DTYPES = (torch.float32, torch.bfloat16)


class DecodeBackend:
    name = "decode"

    def unsupported(self, p: Problem) -> str | None:
        if p.q.device.type != "cpu":
            return "the decode kernel runs on the CPU"
        if p.q.dtype not in DTYPES:
            return "the decode kernel takes float32 and bfloat16"
        if p.dropout:
            return "the decode kernel has no dropout"
        if needs_grad(p):
            return "the decode kernel is for inference: it has no backward"
        if torch.compiler.is_exporting():
            return "an exported graph keeps to torch's own ops (the decode kernel is a custom op)"
        if p.q.shape[2] == 0:
            return "no query rows"
        return unsupported_mask(p.mask)

    def declines(self, p: Problem) -> str | None:
        # constant reasons: no text made from (possibly symbolic) sizes on the hot path
        B, H, Lq, Lk = p.dims
        if Lq > MAX_ROWS:
            return "more than 4 query rows per sequence: not a decode step"
        if Lk < MIN_KEYS:
            return "fewer than 64 keys: too few for the decode step's set-up to pay off"
        return None

    def describe(self, p: Problem) -> str:
        B, H, Lq, Lk = p.dims
        rows = f"{H // p.k.shape[1] * Lq} query rows per kv head"
        why = unavailable()
        if why is None:
            return f"C++ decode kernel: one pass over each kv head's keys and values, online softmax in fp32; {rows}"
        return f"plain torch (K @ q^T, softmax in fp32, p @ V; {rows}), since {why}"

    def run(self, p: Problem) -> torch.Tensor:
        B, H, Lq, Lk = p.dims
        lo, hi, qpos, slopes = key_ranges(p.mask, B, H, Lq, Lk, p.q.device)
        contiguous = p.k.stride(-1) == 1 and p.v.stride(-1) == 1
        return decode_step(p.q, p.k, p.v, lo, hi, qpos, p.scale, p.softcap, slopes, p.sinks, use_kernel=contiguous)
