"""Name the bug: match the learner's outputs (or exception) against the catalogue's variants.

Every candidate role assignment is tried with every form of every known bug, each with the two
fills learners use for blocked scores (-inf and a finite -1e9); the closest variant wins when it
reproduces the learner's outputs within tolerance. An exception is matched by its kind and message
(numbers removed) against the exceptions the variants raise on inputs of the same shapes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import torch

from multihead.checker.loading.calling import attention_inputs
from multihead.checker.bugs.catalogue import BLOCKED_FILL, BUG_OF_FORM, forms_to_try, reference_variant
from multihead.checker.compare import relative_error
from multihead.checker.roles.assign import RoleAssignment, Weights


@dataclass
class Match:
    """The closest variant: its form (None = the correct maths), roles, fill and error; ``scale`` the
    measured factor on the scores it was found with (None: 1/sqrt(D))."""

    form: str | None
    roles: RoleAssignment | None
    fill: float
    error: float
    scale: float | None = None

    @property
    def bug_id(self) -> str | None:
        return None if self.form is None else BUG_OF_FORM[self.form].id


def variant_outputs(module, spec, roles: RoleAssignment, cases, form, fill, scale=None,
                    weights=None) -> list[torch.Tensor]:
    """The variant's output on every case (batch-first inputs, keep pattern (B, Lq, Lk) or None); ``weights``:
    ``roles.weights(module)`` when the caller already holds them."""
    weights = roles.weights(module) if weights is None else weights
    outputs = []
    for *tensors, keep in cases:
        keep4 = None if keep is None else keep[:, None]  # (B, 1, Lq, Lk)
        outputs.append(reference_variant(*attention_inputs(spec, *tensors), weights, keep4, causal=spec.causal_with(keep),
                                         mistake=form, fill=fill, scale=scale, options=spec.options))
    return outputs


def _error(module, spec, roles, cases, wanted, form, fill, scale=None) -> float:
    try:
        with torch.no_grad():
            got = variant_outputs(module, spec, roles, cases, form, fill, scale)
    except RuntimeError:  # e.g. q @ k needs Lk == D: this form cannot produce these outputs
        return math.inf
    return max(relative_error(g, w) for g, w in zip(got, wanted))


def closest(module, spec, assignments, cases, wanted, forms, scale: float | None = None) -> Match:
    """The (form, roles, fill) whose outputs are closest to ``wanted`` (the learner's outputs), with the
    scores scaled by ``scale`` (default 1/sqrt(D))."""
    best = Match(None, None, -math.inf, math.inf)
    fills = (-math.inf, BLOCKED_FILL) if (spec.causal or any(c[3] is not None for c in cases)) \
        else (-math.inf,)
    for form in forms:
        for roles in assignments:
            if form == "kv-heads-tiled" and _kv_heads(roles) == roles.num_heads:
                continue  # without grouped kv heads, tiling them is the correct maths: it names nothing
            for fill in fills:
                error = _error(module, spec, roles, cases, wanted, form, fill, scale)
                if error < best.error or best.roles is None:  # the first candidate stands until one is closer
                    best = Match(form, roles, fill, error, scale)
    return best


def _kv_heads(roles: RoleAssignment) -> int:
    """The number of key/value heads of an assignment (its key rows over the head size)."""
    weights = roles.weights()
    return weights.num_kv_heads


def exception_signature(error: BaseException) -> str:
    """The exception's kind and message with numbers and brackets removed (shapes differ, words don't)."""
    words = re.sub(r"[\d\[\]\(\),:]+", " ", str(error).split("\n")[0])
    return type(error).__name__ + ": " + " ".join(words.split())[:60]


def random_weights(dims: tuple[int, int, int], inner: int, num_heads: int, dtype) -> Weights:
    """Weights q (inner, Eq), k (inner, Ek), v (inner, Ev), o (inner, inner) for inputs of sizes
    ``dims = (Eq, Ek, Ev)``, to replay exceptions (their values do not matter)."""
    gen = torch.Generator().manual_seed(0)
    make = lambda rows, cols: (torch.randn(rows, cols, generator=gen, dtype=dtype), None)  # noqa: E731
    return Weights(*(make(inner, e_in) for e_in in dims), make(inner, inner), num_heads)


def match_exception(error: BaseException, weights: Weights, spec, case) -> str | None:
    """The catalogue form that raises the same kind of exception on the same shapes, or None."""
    wanted = exception_signature(error)
    *tensors, keep = case
    for form in forms_to_try(keep is not None, spec.causal):
        try:
            reference_variant(*attention_inputs(spec, *tensors), weights, None if keep is None else keep[:, None],
                              causal=spec.causal, mistake=form)
        except Exception as raised:
            if exception_signature(raised) == wanted:
                return form
    return None
