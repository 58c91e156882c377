"""Attention backends: each computes the same function with its own kernels.

A backend is an object with
    name: str
    plan(problem, auto) -> plan | Reason
        One look at the call. Either what the backend will run (its own plan object: a mask form,
        blocks, slices; anything, None included) or a `Reason` constant saying why not. With
        auto=False the backend was asked for by name: it returns a Reason only when it cannot compute
        the call exactly (`Reason.cannot`). With auto=True it may also decline (cannot=False) a call
        another backend runs better. A plan reads every host value it needs once; nothing is formatted.
    run(problem, plan) -> Tensor          (B, H, Lq, Dv), from the plan it made for this problem
    describe(problem, plan) -> str        how it will run (kernel, mask form), for mh.dispatch only
`BACKENDS` lists them in the order "auto" tries them: fastest first, the reference math last.
Reasons are constant codes (reasons.py); only `mh.dispatch` turns them into words.

A backend written against the older protocol (unsupported(p) / declines(p) -> str | None, run(p),
describe(p)) joins through `as_backend`, which wraps it in this one.
"""
from __future__ import annotations

from multihead.backends.banded import BandedBackend
from multihead.backends.flex import FlexBackend
from multihead.backends.problem import Problem
from multihead.backends.reasons import Reason, cannot, declines
from multihead.backends.reference import MathBackend
from multihead.backends.sdpa import SdpaBackend
from multihead.backends.varlen import VarlenBackend


class _OlderProtocol:
    """A backend with unsupported / declines / run(p) / describe(p), seen through plan / run(p, plan)."""

    def __init__(self, backend):
        self.backend, self.name = backend, backend.name

    def plan(self, p: Problem, auto: bool = True):
        why = self.backend.unsupported(p)
        if why is not None:
            return cannot(f"{self.name}.unsupported", why)
        why = self.backend.declines(p) if auto else None
        return None if why is None else declines(f"{self.name}.declines", why)

    def run(self, p: Problem, plan=None):
        return self.backend.run(p)

    def describe(self, p: Problem, plan=None) -> str:
        return self.backend.describe(p)


def as_backend(backend):
    """`backend` itself when it has plan(); else wrapped from the older protocol."""
    return backend if hasattr(backend, "plan") else _OlderProtocol(backend)


BACKENDS = [as_backend(b) for b in (VarlenBackend(), BandedBackend(), SdpaBackend(), FlexBackend(), MathBackend())]

__all__ = ["BACKENDS", "Problem", "Reason", "as_backend"]
