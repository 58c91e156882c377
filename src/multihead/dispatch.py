"""Which backend runs, and why the others were not chosen.

    >>> d = mh.dispatch(q, k, v, mh.Mask.causal())
    >>> print(d)
    sdpa: F.scaled_dot_product_attention, is_causal=True (the causal structure is kept, no dense mask)
      math: not chosen: reference math materialises the (B, H, Lq, Lk) = ... scores; slower
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from multihead.backends import BACKENDS, Problem
from multihead.errors import AttentionError

if TYPE_CHECKING:
    import torch

    from multihead.masks import Mask


@dataclass(frozen=True)
class Decision:
    """The chosen backend, how it will run, and a reason for every backend not chosen."""

    backend: str
    detail: str
    reasons: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        lines = [f"{self.backend}: {self.detail}"]
        lines += [f"  {name}: not chosen: {why}" for name, why in self.reasons.items()]
        return "\n".join(lines)


def backend_names() -> list[str]:
    return [b.name for b in BACKENDS]


def pick(problem: Problem, backend: str = "auto"):
    """The backend object that runs a validated problem; formats no reasons (the hot path).

    backend="auto": the first backend that can run it and does not decline it, else the last one
    that can (reference math). A backend name: that backend, or AttentionError if it cannot run it.
    """
    if backend == "auto":
        for candidate in BACKENDS:
            if candidate.unsupported(problem) is None and candidate.declines(problem) is None:
                return candidate
        return next(b for b in reversed(BACKENDS) if b.unsupported(problem) is None)
    for candidate in BACKENDS:
        if candidate.name == backend:
            why = candidate.unsupported(problem)
            if why is not None:
                raise AttentionError(f"backend {backend!r} cannot run this call: {why}.")
            return candidate
    raise AttentionError(f"backend must be 'auto' or one of {backend_names()}; got {backend!r}.")


def decide(problem: Problem, backend: str = "auto") -> Decision:
    """`pick`'s choice, how it will run, and why each other backend was not chosen."""
    chosen = pick(problem, backend)
    reasons = {}
    for other in BACKENDS:
        if other is chosen:
            continue
        if backend != "auto":
            reasons[other.name] = f"not requested (backend={backend!r})"
        else:
            reasons[other.name] = (other.unsupported(problem) or other.declines(problem)
                                   or f"{chosen.name} ranks first and accepted the call")
    return Decision(chosen.name, chosen.describe(problem), reasons)


def dispatch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None = None, *, causal: bool = False,
             scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
             dropout: float = 0.0, backend: str = "auto") -> Decision:
    """Which backend `attention(q, k, v, mask, ...)` would run, with the reasons; computes nothing."""
    from multihead.attention import make_problem

    return decide(make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks), backend)
