"""A learner's multi-head latent attention (MLA): its naive forward, then its absorbed path.

An MLA module tells the checker where its absorbed path is, as ``mh.MultiHeadLatentAttention`` does:
a flag of its forward (``forward(x, absorb=True)``; also ``absorbed``, ``use_absorption``...) or a method
(``forward_absorbed(x)``...). Its verdict, when its Linears fit MLA's roles (``roles/latent.py``):

1. the naive forward must match MLA written out plainly on its own weights (``latent_variant``), in
   some head count, order of roles and RoPE pairing (or none), forward and gradients;
2. the absorbed path must give the naive forward's outputs -> PASS;
3. otherwise the absorbed variant with a known mistake that reproduces it names the bug: each head's
   W_UK used transposed when folded into the query (it runs only when Dn == C). The report gives the
   evidence: the naive and absorbed outputs differ, and with W_UK transposed back (in a copy of the
   module) its absorbed path agrees with its naive forward.

A module without an absorbed path whose naive forward matches MLA on its own weights (roles read from its
dataflow) passes on step 1 alone (``kind`` "latent-naive"); one that does not match is checked as plain
attention.

Low-rank queries (W_DQ, an optional norm on the query latent, W_UQ: DeepSeek's q_a_proj, q_a_layernorm,
q_b_proj) are found like the latent and run with the module's own norm; the rotary queries may come from
a Linear of their own (W_QR). Not modelled: masks and caches
(the module is then checked as plain attention, whose roles it does not fit).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, replace

import torch

from multihead.checker.loading.calling import LearnerError, first_tensor, invoke, learner_frame
from multihead.checker.compare import gradient_error, learned_parameters, relative_error
from multihead.checker.roles.latent import WUK_TRANSPOSED, find_latent_roles, latent_variant
from multihead.checker.targets.latent_switch import SWITCHED, AbsorbedTwins
from multihead.checker.loading.probes import plain_cases
from multihead.checker.roles.assign import linear_layers
from multihead.checker.behaviour.rotary import ROPE_TOLERANCE, rotaries
from multihead.checker.behaviour.scale import fit_scale, scale_bug
from multihead.checker.bugs.sentences import say

ABSORB_FLAGS = ("absorb", "absorbed", "use_absorption", "absorption", "absorb_weights", "weight_absorption")
ABSORB_METHODS = ("forward_absorbed", "absorbed_forward", "forward_absorb")


@dataclass
class AbsorbedPath:
    """How to run a module's absorbed path: a forward flag, a method (by name), or a switch in its file
    (``twins``: the absorbed twin of the naive module, ``latent_switch.py``)."""

    flag: str | None
    method: str | None
    twins: AbsorbedTwins | None = None

    @property
    def name(self) -> str:
        if self.twins is not None:
            return f"{self.twins.switch.name} = {self.twins.switch.absorbed!r}"
        return f"forward(x, {self.flag}=True)" if self.flag else f"{self.method}(x)"

    def __call__(self, module, spec, x: torch.Tensor) -> torch.Tensor:
        """The absorbed path's output on batch-first x, called the way ``spec`` calls the module's forward."""
        if self.twins is not None:
            return self.twins.call(module, lambda twin: invoke(twin, spec, x))
        if self.flag:
            return invoke(module, replace(spec, fixed={**spec.fixed, self.flag: True}), x)
        return first_tensor(getattr(module, self.method)(x))


def find_absorbed(module) -> AbsorbedPath | None:
    """The module's absorbed path (module docstring), or None."""
    if module in SWITCHED:
        return AbsorbedPath(None, None, SWITCHED[module])
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    flag = next((name for name in params if name.lower() in ABSORB_FLAGS), None)
    method = next((name for name in ABSORB_METHODS if callable(getattr(module, name, None))), None)
    return AbsorbedPath(flag, None) if flag else AbsorbedPath(None, method) if method else None


@dataclass
class _Fit:
    roles: object  # latent_roles.LatentRoles
    rope: object  # rotary.Rotary or None
    error: float
    scale: float | None = None  # the factor on the scores it was measured with (None: 1/sqrt(Dn + R))


def _error(got: list, want: list) -> float:
    return max(relative_error(g, w) for g, w in zip(got, want))


def _closest(candidates, xs, wanted, causal: bool, bases) -> _Fit:
    """The (roles, rotation) whose naive MLA comes closest to the learner's naive outputs."""
    best = _Fit(None, None, float("inf"))
    for rope in [None] + rotaries(bases, True):
        for roles in candidates:
            try:
                with torch.no_grad():
                    error = _error([latent_variant(roles, x, rope, causal) for x in xs], wanted)
            except RuntimeError:  # widths that do not fit these roles
                continue
            if error < best.error or best.roles is None:
                best = _Fit(roles, rope, error)
    return best


def check_latent(module, spec, setup, report, found_conventions: list) -> bool:
    """Judge an MLA module (module docstring) and fill ``report``; False (report untouched) when its
    Linears do not fit MLA's roles, or, without an absorbed path, its forward is not MLA on them."""
    path = find_absorbed(module)
    if spec.inputs != "x" or spec.layout != "batch":
        return False
    xs = [case[0] for case in plain_cases(setup.dims, setup.dtype, setup.length, setup.length)]
    candidates = find_latent_roles(module, linear_layers(module), lambda x: invoke(module, spec, x), xs[0],
                                   setup.heads)
    if not candidates:
        return False
    with torch.no_grad():
        wanted = [invoke(module, spec, x) for x in xs]
    fit = _closest(candidates, xs, wanted, spec.causal, setup.rope_bases)
    tol = setup.tol if fit.rope is None else max(setup.tol, ROPE_TOLERANCE)
    scaled = _measured_scale(fit, xs, wanted, spec.causal, tol) if fit.roles is not None and fit.error > tol \
        else None
    if fit.roles is None or (path is None and fit.error > tol and scaled is None):
        return False
    roles, lang = fit.roles, report.lang
    report.kind = "latent" if path else "latent-naive"
    report.verdict, report.error, report.roles = "fail", fit.error, roles.describe()
    report.conventions = found_conventions + [("mla" if path else "mla-naive", {
        "heads": roles.num_heads, "nope": roles.nope, "rope": roles.rope_dim, "value": roles.value_dim,
        "latent": roles.latent, "path": path.name if path else ""})]
    if roles.q_down is not None:
        report.conventions.append(("mla-q-latent", {"q_latent": roles.q_down.out_features}))
    if fit.rope is not None:
        report.conventions.append(("mla-rope:" + ("interleaved" if fit.rope.tables_interleaved else "half"),
                                   {"base": f"{fit.rope.base:g}"}))
    if scaled is not None:  # MLA on its weights, with a scale other than 1/sqrt(Dn + R)
        report.error, (report.bug, report.ambiguous) = scaled.error, scale_bug(scaled.scale, roles.num_heads,
                                                                               roles.nope + roles.rope_dim)
        right = (roles.nope + roles.rope_dim) ** -0.5
        report.notes.append(say("scale-measured", lang, measured=scaled.scale, right=right))
        if abs(scaled.scale * roles.nope ** 0.5 - 1) <= 1e-3:
            report.notes.append(say("mla-scale-nope", lang, nope=roles.nope, rope=roles.rope_dim))
        return True
    if fit.error > tol:
        report.reason = say("mla-naive-differs", lang, error=fit.error)
        return True
    report.grad_error = max(_gradient_error(module, spec, fit, x, index) for index, x in enumerate(xs))
    if report.grad_error > tol:
        return True
    if path is None:  # nothing more to compare
        report.verdict = "pass"
        return True
    try:
        with torch.no_grad():
            absorbed = [path(module, spec, x) for x in xs]
    except Exception as error:  # the learner's absorbed path raised (a transposed W_UK when Dn != C...)
        error = error.error if isinstance(error, LearnerError) else error
        report.exception, report.where = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}", \
            learner_frame(error)
        report.notes.append(say("mla-absorbed-raises", lang, path=path.name))
        return True
    error = _error(absorbed, wanted)
    if error <= tol:
        report.verdict, report.error = "pass", max(fit.error, error)
        return True
    report.error = error
    if _mistake_error(roles, fit.rope, xs, absorbed, spec.causal) <= tol:
        report.bug = WUK_TRANSPOSED
        report.notes.append(say("mla-wuk-evidence", lang, path=path.name, naive=fit.error, absorbed=error,
                                back=_transposed_back(module, spec, roles, path, xs, wanted)))
        return True
    report.reason = say("mla-absorbed-differs", lang, path=path.name, naive=fit.error, error=error)
    return True


def _measured_scale(fit: _Fit, xs, wanted, causal: bool, tol: float) -> _Fit | None:
    """The closest roles and rotation with the scale on the scores that reproduces the learner's naive
    outputs (``_Fit.scale``), or None when no scale does."""
    def error_at(scale: float) -> float:
        try:
            with torch.no_grad():
                return _error([latent_variant(fit.roles, x, fit.rope, causal, scale=scale) for x in xs], wanted)
        except RuntimeError:
            return float("inf")

    scale, error = fit_scale(error_at, (fit.roles.nope + fit.roles.rope_dim) ** -0.5)
    return _Fit(fit.roles, fit.rope, error, scale) if error <= tol else None


def _gradient_error(module, spec, fit: _Fit, x: torch.Tensor, index: int) -> float:
    """The naive forward's gradients (input and parameters) against the plain MLA's, for one input."""
    x = x.detach().clone().requires_grad_(True)
    try:
        got = invoke(module, spec, x)
    except LearnerError:
        return float("inf")
    want = latent_variant(fit.roles, x, fit.rope, spec.causal)
    return gradient_error(got, want, [x] + learned_parameters(module), index)


def _mistake_error(roles, rope, xs, absorbed, causal: bool) -> float:
    """How far the absorbed variant with W_UK transposed is from the learner's absorbed outputs."""
    try:
        with torch.no_grad():
            return _error([latent_variant(roles, x, rope, causal, absorbed=True, mistake=WUK_TRANSPOSED)
                           for x in xs], absorbed)
    except RuntimeError:  # Dn != C: the transpose does not even run
        return float("inf")


def _transposed_back(module, spec, roles, path: AbsorbedPath, xs, wanted) -> float:
    """The evidence: with every head's (Dn, C) block of W_UK transposed (in place, then restored), the
    learner's absorbed path against its own naive outputs (``wanted``, original weights)."""
    proj, rows = roles.up_k
    weight = module.get_parameter(proj.weight_name)
    H, Dn, C = roles.num_heads, roles.nope, roles.latent
    rows = torch.arange(H * Dn) if rows is None else rows
    with torch.no_grad():
        kept = weight.detach().clone()
        weight[rows] = weight[rows].view(H, Dn, C).transpose(1, 2).reshape(H * Dn, C)
        try:
            return _error([path(module, spec, x) for x in xs], wanted)
        except Exception:  # its absorbed path does not run on the changed weights
            return float("inf")
        finally:
            weight.copy_(kept)
