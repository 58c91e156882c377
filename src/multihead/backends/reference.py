"""The math backend: attention as a learner writes it (common.py's reference), softmax in float32.

Setting blocked weights to 0 *after* the softmax is what makes a fully masked row return exactly
zero with zero gradient: its uniform weights are all blocked, so nothing flows either way.
"""
from __future__ import annotations

import torch

from multihead.backends.capabilities import Capabilities
from multihead.backends.common import reference_on_grid
from multihead.backends.problem import Problem
from multihead.backends.reasons import declines

MATERIALISES = declines("math.materialises", lambda p: "reference math materialises the (B, H, Lq, Lk) = "
                                                      f"{tuple(p.dims)} scores; slower")


class MathBackend:
    """Plan: None (the reference needs nothing prepared)."""

    name = "math"
    capabilities = Capabilities(lse=True)

    def plan(self, p: Problem, auto: bool = True):
        return MATERIALISES if auto else None

    def describe(self, p: Problem, plan=None) -> str:
        extras = "".join((", softcap" if p.softcap is not None else "", ", sinks" if p.sinks is not None else ""))
        return "plain matmul + float32 softmax + matmul" + extras

    def run(self, p: Problem, plan=None) -> torch.Tensor:
        return reference_on_grid(p.q, p.k, p.v, p.form, p.index(), p.dropout, p.scale, p.softcap, p.sinks, p.lse)
