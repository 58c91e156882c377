"""Measure the scale a module applies to its scores, and name the scale bug from the number.

Scale bugs are not matched against fixed variants: for each role assignment the factor s in
softmax(s * q @ k^T) that reproduces the module's outputs is fitted (a coarse scan over powers of
sqrt(2), then a golden-section search on log s). The measured s is then compared with what each known
mistake gives for this module's H heads of size D:

    1/sqrt(D) correct      1 missing-scale      1/sqrt(H*D) scale-by-embed-dim
    1/(2 sqrt(D)) scale-halved      1/D scale-by-head-dim (also D**-0.5 applied to q and to k)

Two mistakes can give the same number for one head count (H = 4: 1/sqrt(4D) = 1/(2 sqrt(D))); then
``ambiguous`` lists both, and the checker rebuilds the module with another head count to decide.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from multihead.checker.bugs.catalogue import BUG_OF_FORM, SCALE_FORMS
from multihead.checker.bugs.diagnose import variant_outputs
from multihead.checker.compare import relative_error

_SCAN = [2.0 ** (k / 2) for k in range(-8, 9)]  # s * sqrt(D) from 2**-4 to 2**4
_CLOSE = 1e-3  # relative distance at which a measured scale counts as a known one
# a scan error above which no scale between the scan's steps can reproduce the outputs: half a step off
# (a factor 2**(1/4)) costs at most ~0.04 on the zoo, and forms that no scale explains stay above ~0.45
_HOPELESS_SCAN = 0.4


@dataclass
class ScaleMatch:
    """The measured scale and what it means."""

    scale: float  # the fitted factor s
    right: float  # 1/sqrt(D)
    error: float  # the relative output error at s
    roles: object  # the RoleAssignment it was measured with
    form: str | None = None  # the catalogue form measured with it (None: otherwise correct maths)
    bug: str = "wrong-scale"
    ambiguous: list[str] = field(default_factory=list)  # ids that give the same s for this head count


def _error(module, spec, roles, cases, wanted, scale: float, fill: float, form=None, weights=None) -> float:
    try:
        with torch.no_grad():
            got = variant_outputs(module, spec, roles, cases, form, fill, scale=scale, weights=weights)
    except RuntimeError:
        return math.inf
    return max(relative_error(g, w) for g, w in zip(got, wanted))


def _golden(f, low: float, high: float, steps: int = 36, check_at: int = 18, hopeless: float = 1e-3):
    """(x, f(x)) minimising f on [low, high] (log-scale coordinates); gives up after ``check_at`` steps
    when f is still above ``hopeless`` (a true scale is within 1e-5 of zero error by then)."""
    ratio = (math.sqrt(5) - 1) / 2
    a, b = low, high
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = f(c), f(d)
    for step in range(steps):
        if step == check_at and min(fc, fd) > hopeless:
            break
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = f(d)
    return (c, fc) if fc < fd else (d, fd)


def measure_scale(module, spec, assignments, cases, wanted, tol: float, fills, form=None) -> ScaleMatch | None:
    """The scale that reproduces ``wanted`` with otherwise correct maths (or with the catalogue ``form``:
    a second bug next to a wrong scale), named; None if none does.

    The scan uses the first case only and the search the cases without a mask (a scale does not
    depend on masks); the result is then verified on every case, with each fill."""
    plain = [i for i, case in enumerate(cases) if case[3] is None] or [0]
    scanned = []
    for roles in assignments:
        weights = roles.weights(module)  # the parameters do not change during the search
        right = weights.head_dim ** -0.5
        for step in _SCAN:
            error = _error(module, spec, roles, cases[:1], wanted[:1], right * step, fills[0], form, weights)
            scanned.append((error, step, roles, right, weights))
    scanned.sort(key=lambda item: item[0])
    best = None
    for _, step, roles, right, weights in [item for item in scanned[:2] if item[0] <= _HOPELESS_SCAN]:
        def at(log_s, roles=roles, right=right, weights=weights):
            return _error(module, spec, roles, [cases[i] for i in plain], [wanted[i] for i in plain],
                          right * math.exp(log_s), fills[0], form, weights)

        log_s, _ = _golden(at, math.log(step) - 0.35, math.log(step) + 0.35)
        scale = right * math.exp(log_s)
        error = min(_error(module, spec, roles, cases, wanted, scale, fill, form, weights) for fill in fills)
        if best is None or error < best.error:
            best = ScaleMatch(scale, right, error, roles, form)
    if best is None or best.error > tol:
        return None
    return _name(best)


def _name(match: ScaleMatch) -> ScaleMatch:
    """Fill in the bug id(s) whose scale is the measured one."""
    weights = match.roles.weights()
    match.bug, match.ambiguous = scale_bug(match.scale, weights.num_heads, weights.head_dim)
    return match


def scale_bug(scale: float, heads: int, head_dim: int) -> tuple[str, list[str]]:
    """(the scale bug a measured ``scale`` names for H heads of D features, the ids it fits when more than one
    does); "wrong-scale" when it fits no known mistake."""
    close = [BUG_OF_FORM[form].id for form, factor in SCALE_FORMS.items()
             if abs(scale - factor(heads, head_dim)) <= _CLOSE * factor(heads, head_dim)]
    return (close[0], close if len(close) > 1 else []) if close else ("wrong-scale", [])


def fit_scale(error_at, right: float) -> tuple[float, float]:
    """(the factor s, its error) that minimises ``error_at(s)``: a scan over powers of sqrt(2) around ``right``
    (the correct 1/sqrt(D)), then a golden-section search on log s around the best two."""
    scanned = sorted((error_at(right * step), step) for step in _SCAN)
    best = (math.inf, right)
    for _, step in [item for item in scanned[:2] if item[0] <= _HOPELESS_SCAN]:
        log_s, error = _golden(lambda log: error_at(right * math.exp(log)), math.log(step) - 0.35,
                               math.log(step) + 0.35)
        best = min(best, (error, right * math.exp(log_s)))
    return best[1], best[0]
