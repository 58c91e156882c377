"""Which backend runs, and why the others were not chosen.

    >>> d = mh.dispatch(q, k, v, mh.Mask.causal())
    >>> print(d)
    sdpa: F.scaled_dot_product_attention, is_causal=True (the causal structure is kept, no dense mask)
      math: not chosen: reference math materialises the (B, H, Lq, Lk) = ... scores; slower

`pick` is the hot path: one plan per call, reasons as constant codes (backends/reasons.py).
`decide` and `dispatch` put those codes into words, here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from multihead.backends import BACKENDS, Problem, Reason
from multihead.backends.problem import make_problem
from multihead.errors import AttentionError

if TYPE_CHECKING:
    from multihead.masks import Mask


@dataclass(frozen=True)
class Decision:
    """The chosen backend, how it will run, and a reason for every backend not chosen."""

    backend: str
    detail: str
    reasons: dict[str, str] = field(default_factory=dict)
    codes: dict[str, str] = field(default_factory=dict)  # the same reasons as stable codes

    def __str__(self) -> str:
        lines = [f"{self.backend}: {self.detail}"]
        lines += [f"  {name}: not chosen: {why}" for name, why in self.reasons.items()]
        return "\n".join(lines)


def backend_names() -> list[str]:
    return [b.name for b in BACKENDS]


def pick(problem: Problem, backend: str = "auto"):
    """(backend object, its plan) for a validated problem; formats nothing (the hot path).

    backend="auto": the first backend whose plan accepts the call, else the last one that can run it
    (reference math). A backend name: that backend's plan, or AttentionError if it cannot run the call.
    The choice and its plan are remembered on the mask for the call's signature (shapes, dtype,
    device, options, whether autograd needs a gradient) while the mask's tensors are unchanged, so
    a model that reuses one Mask decides once (see Mask.memoized for when nothing is remembered).
    """
    mask = problem.mask
    if mask is None:
        return _choose(problem, backend)
    q, k, v, sinks = problem.q, problem.k, problem.v, problem.sinks
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                        or sinks is not None and sinks.requires_grad)
    signature = ("plan", backend, q.shape, k.shape, v.shape, q.dtype, q.device, problem.dropout, problem.softcap,
                 sinks is None, grad)
    return mask.memoized(signature, lambda: _choose(problem, backend))


def _choose(problem: Problem, backend: str):
    if backend == "auto":
        for candidate in BACKENDS:
            plan = candidate.plan(problem, True)
            if not isinstance(plan, Reason):
                return candidate, plan
        backend = BACKENDS[-1].name  # every backend declined: the reference math runs it
    for candidate in BACKENDS:
        if candidate.name == backend:
            plan = candidate.plan(problem, False)
            if isinstance(plan, Reason):
                raise AttentionError(f"backend {backend!r} cannot run this call: {plan.text(problem)}.")
            return candidate, plan
    raise AttentionError(f"backend must be 'auto' or one of {backend_names()}; got {backend!r}.")


def decide(problem: Problem, backend: str = "auto") -> Decision:
    """`pick`'s choice, how it will run, and why each other backend was not chosen (in words)."""
    chosen, plan = pick(problem, backend)
    reasons, codes = {}, {}
    for other in BACKENDS:
        if other is chosen:
            continue
        if backend != "auto":
            reasons[other.name], codes[other.name] = f"not requested (backend={backend!r})", "not-requested"
            continue
        why = other.plan(problem, True)
        if isinstance(why, Reason):
            reasons[other.name], codes[other.name] = why.text(problem), why.code
        else:
            reasons[other.name] = f"{chosen.name} ranks first and accepted the call"
            codes[other.name] = "ranked-after"
    return Decision(chosen.name, chosen.describe(problem, plan), reasons, codes)


def dispatch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None = None, *, causal: bool = False,
             scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
             dropout: float = 0.0, backend: str = "auto") -> Decision:
    """Which backend `attention(q, k, v, mask, ...)` would run, with the reasons; computes nothing."""
    return decide(make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks), backend)
