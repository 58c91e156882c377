"""Which backend runs, and why the others were not chosen.

    >>> d = mh.dispatch(q, k, v, mh.Mask.causal())
    >>> print(d)
    sdpa: F.scaled_dot_product_attention, is_causal=True (the causal structure is kept, no dense mask)
      math: not chosen: reference math materialises the (B, H, Lq, Lk) = ... scores; slower
"""
from __future__ import annotations

from dataclasses import dataclass, field

from multihead.backends import BACKENDS, Problem
from multihead.errors import AttentionError


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


def choose(problem: Problem, backend: str = "auto", explain: bool = True):
    """(backend object, Decision) for a validated problem. `backend` is "auto" or a backend name.

    explain=False (the hot path of `attention`) returns (backend object, None): it stops at the first
    backend that accepts and formats no reasons.
    """
    reasons: dict[str, str] = {}
    if backend != "auto":
        for candidate in BACKENDS:
            if candidate.name == backend:
                why = candidate.unsupported(problem)
                if why is not None:
                    raise AttentionError(f"backend {backend!r} cannot run this call: {why}.")
                if not explain:
                    return candidate, None
                reasons = {b.name: f"not requested (backend={backend!r})" for b in BACKENDS if b is not candidate}
                return candidate, Decision(candidate.name, candidate.describe(problem), reasons)
        raise AttentionError(f"backend must be 'auto' or one of {backend_names()}; got {backend!r}.")

    chosen = None
    for candidate in BACKENDS:
        if chosen is not None and not explain:
            break
        why = candidate.unsupported(problem) or candidate.declines(problem)
        if chosen is not None:
            reasons[candidate.name] = why or f"{chosen.name} ranks first and accepted the call"
            continue
        if why is None:
            chosen = candidate
        else:
            reasons[candidate.name] = why
    if chosen is None:  # every backend declined: the last one (reference math) still computes it exactly
        chosen = next(b for b in reversed(BACKENDS) if b.unsupported(problem) is None)
        reasons.pop(chosen.name, None)
    if not explain:
        return chosen, None
    return chosen, Decision(chosen.name, chosen.describe(problem), reasons)


def dispatch(q, k, v, mask=None, *, causal=False, scale=None, dropout=0.0, backend="auto") -> Decision:
    """Which backend `attention(q, k, v, mask, ...)` would run, with the reasons; computes nothing."""
    from multihead.attention import make_problem

    return choose(make_problem(q, k, v, mask, causal, scale, dropout), backend)[1]
