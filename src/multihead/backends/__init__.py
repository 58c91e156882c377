"""Attention backends: each computes the same function with its own kernels.

A backend is an object with
    name: str
    unsupported(problem) -> str | None   why it cannot compute this problem exactly (None: it can)
    declines(problem) -> str | None      why "auto" should prefer another one (None: it is a good pick)
    describe(problem) -> str             how it will run (kernel, mask form), for dispatch decisions
    run(problem) -> Tensor               (B, H, Lq, Dv)
`BACKENDS` lists them in the order "auto" tries them: fastest first, the reference math last.
"""
from __future__ import annotations

from multihead.backends.banded import BandedBackend
from multihead.backends.decode import DecodeBackend
from multihead.backends.flex import FlexBackend
from multihead.backends.reference import MathBackend
from multihead.backends.problem import Problem
from multihead.backends.sdpa import SdpaBackend
from multihead.backends.varlen import VarlenBackend

BACKENDS = [DecodeBackend(), VarlenBackend(), BandedBackend(), SdpaBackend(), FlexBackend(), MathBackend()]

__all__ = ["BACKENDS", "Problem"]
