"""``check``: load, find conventions and roles, compare with the reference, name the bug.

Order of work: build the module (eval mode, dropout off, float64 when it runs in float64), read its
forward signature, find its layout, causality and mask convention by behaviour, record which Linear
sees which input, run a few probe cases, then pick the role assignment that reproduces its outputs
with the correct maths (PASS after a forward + gradient comparison with ``MultiHeadAttention``) or
with one catalogue bug (FAIL, named). When its own code raises, the checker retries with
Lq = Lk = head_dim (where a missing key transpose still runs) before diagnosing the exception.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import nn

from multihead.checker import conventions as conv
from multihead.checker.calling import CallSpec, LearnerError, invoke, read_signature
from multihead.checker.catalogue import BUG_OF_FORM, forms_to_try
from multihead.checker.compare import compare_with_reference
from multihead.checker.diagnose import closest, match_exception, random_weights
from multihead.checker.hints import Hints, apply_hints, parse_hints
from multihead.checker.load import (EMBED, EMBED_NAMES, HEAD_NAMES, KEY_SIZE_NAMES, LENGTH_NAMES,
                                  QUERY_SIZE_NAMES, VALUE_SIZE_NAMES, LoadError, build, load_class,
                                  misspelled_forward, parse_init)
from multihead.checker.masks import detect_encoding, encoding_by_agreement
from multihead.checker.probes import PROBE_BATCH, inputs, masked_cases, plain_cases
from multihead.checker.report import CheckReport
from multihead.checker.roles import LinearInputs, candidate_roles, linear_layers
from multihead.checker.text import check_lang, say

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}  # relative, see compare.relative_error


def check(target, *, init=None, call=None, lang: str = "en") -> CheckReport:
    """Check a multi-head attention module: ``target`` is a "file.py:Class" string, a class or an
    instance (never modified: the checker works on a copy). ``init``: constructor kwargs (dict or
    JSON text); ``call``: hints like "heads=4,layout=seq"; ``lang``: "en" or "zh"."""
    lang = check_lang(lang)
    threads = torch.get_num_threads()
    printed = io.StringIO()
    torch.set_num_threads(1)  # the probes are tiny: one thread is many times faster than a pool
    try:  # the learner's debugging prints stay out of the report; the caller's random state is kept
        with contextlib.redirect_stdout(printed), torch.random.fork_rng(devices=[]):
            report = _check(target, init, call, lang)
    finally:
        torch.set_num_threads(threads)
    if printed.getvalue():
        report.notes.append(say("printed", lang))
    return report


def _check(target, init, call, lang: str) -> CheckReport:
    report = CheckReport(target=_target_name(target), lang=lang)
    try:
        module, kwargs = _resolve(target, init)
        hints = parse_hints(call)
    except LoadError as error:
        report.reason = error.text(lang)
        return report
    try:
        return _check_built(module, kwargs, hints, report)
    except Exception as error:  # a module the checker cannot handle: say so, never a traceback
        report.verdict, report.bug = "error", None
        report.reason = say("internal", lang, error=f"{type(error).__name__}: {error}")
        return report


def _check_built(module, kwargs, hints, report) -> CheckReport:
    """Check a built module, naming a misspelled forward first."""
    lang = report.lang
    method = misspelled_forward(type(module))
    if method is None:
        return _check_module(module, kwargs, hints, report)
    # nn.Module.forward raises NotImplementedError: name the typo, then check the method it meant.
    meant = getattr(module, method).__func__
    module.__class__ = type(type(module).__name__, (type(module),), {"forward": meant})
    inner = _check_module(module, kwargs, hints, CheckReport(target=report.target, lang=lang))
    report.verdict, report.bug, report.bug_values = "fail", "forward-misspelled", {"method": method}
    report.conventions, report.roles = inner.conventions, inner.roles
    report.notes.append(_say_after_rename(method, inner))
    return report


def _say_after_rename(method: str, inner: CheckReport) -> str:
    """What the rest of the check found once ``method`` is used as forward."""
    if inner.passed:
        return say("after-rename-pass", inner.lang, method=method)
    if inner.bug:
        return say("after-rename-bug", inner.lang, method=method, bug=inner.bug)
    return say("after-rename", inner.lang, method=method, verdict=inner.headline())


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    cls = target if isinstance(target, type) else type(target)
    return cls.__name__


def _resolve(target, init) -> tuple[nn.Module, dict]:
    """(a module instance the checker may change, the constructor kwargs)."""
    if isinstance(init, Mapping):
        kwargs = dict(init)
    elif isinstance(init, (str, type(None))):
        kwargs = parse_init(init)
    else:
        raise LoadError(f"init must be a dict of keyword arguments or its JSON text, got {type(init).__name__}",
                        f"init 必须是关键字参数的 dict 或其 JSON 文本，实际是 {type(init).__name__}")
    if isinstance(target, nn.Module):
        try:
            return copy.deepcopy(target).cpu(), kwargs
        except Exception as error:  # e.g. a module holding an open file or a generator
            why = f"{type(error).__name__}: {error}"
            raise LoadError(f"cannot copy the module to check it ({why}); pass its class instead",
                            f"无法复制这个模块来检查（{why}）；请改为传入它的类") from error
    cls = load_class(target) if isinstance(target, str) else target
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise LoadError(f"expected an nn.Module class or instance, got {type(target).__name__}",
                        f"需要 nn.Module 的类或实例，实际是 {type(target).__name__}")
    return build(cls, kwargs)


def _heads_hint(module, kwargs, hints: Hints) -> int | None:
    """The number of heads from --call, the constructor arguments or the module's attributes."""
    return hints.heads or _size(HEAD_NAMES, kwargs, module)


def _size(names, kwargs: dict, module=None) -> int | None:
    """The first positive int among the arguments ``names`` (then the module's attributes), or None."""
    found = [kwargs.get(n) for n in names] + [getattr(module, n, None) for n in names if module is not None]
    return next((v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)


def _input_dims(module, kwargs) -> tuple[int, int, int]:
    """(Eq, Ek, Ev): the query's from a size argument (query_size, d_model...), else the first Linear;
    the key's and value's from key_size/kdim and value_size/vdim (arguments or attributes), else Eq."""
    first_linear = next(iter(linear_layers(module).values()), None)
    query = _size(QUERY_SIZE_NAMES + EMBED_NAMES, kwargs) or (first_linear.in_features if first_linear else EMBED)
    key = _size(KEY_SIZE_NAMES, kwargs, module) or query
    value = _size(VALUE_SIZE_NAMES, kwargs, module) or query
    return query, key, value


@dataclass
class Setup:
    """What every step needs besides the module and its CallSpec."""

    dims: tuple[int, int, int]  # (Eq, Ek, Ev)
    heads: int | None  # from hints, arguments or attributes; None = find by behaviour
    hints: Hints
    context_limited: bool  # built with a context length: probes stay within 6 tokens, Lq = Lk
    square: int | None = None  # Lq = Lk = head_dim (the retry after an exception), else None
    dtype: torch.dtype = torch.float64

    @property
    def tol(self) -> float:
        return TOLERANCE[self.dtype]

    @property
    def length(self) -> int:
        return self.square or 5


def _check_module(module, kwargs, hints, report, square: int | None = None) -> CheckReport:
    """Check a built module; when its code raises, retry once with Lq = Lk = head_dim, then diagnose."""
    module.eval()
    spec = apply_hints(read_signature(module.forward), hints)
    setup = Setup(_input_dims(module, kwargs), _heads_hint(module, kwargs, hints), hints,
                  any(name in kwargs for name in LENGTH_NAMES), square)
    if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in module.modules()):
        try:  # materialise LazyLinear with one float32 call
            invoke(module, spec, *inputs(setup.dims, PROBE_BATCH, 5, 5, torch.float32, 0))
        except LearnerError:
            pass
    try:
        return _check_running(module, spec, setup, report)
    except LearnerError as raised:
        _diagnose_exception(raised, module, spec, setup, report)
        head_dim = (setup.dims[0] // setup.heads) if setup.heads else None
        if square is None and not report.bug and head_dim and head_dim >= 2 and head_dim != PROBE_BATCH:
            retry = _check_module(module, kwargs, hints, CheckReport(target=report.target, lang=report.lang),
                                  square=head_dim)
            if retry.verdict == "fail" and retry.bug:  # e.g. q @ k, which only runs when L == D
                retry.exception = report.exception
                return retry
        return report


def _dtype(module, spec, dims) -> torch.dtype:
    """float64 when the module runs in float64 (its own float32 constants may forbid it)."""
    module.double()
    try:
        invoke(module, spec, *inputs(dims, PROBE_BATCH, 5, 5, torch.float64, 0))
        return torch.float64
    except LearnerError:
        module.float()
        return torch.float32


def _check_running(module, spec: CallSpec, setup: Setup, report) -> CheckReport:
    """Conventions, roles, then the verdict (the learner's exceptions propagate as LearnerError)."""
    setup.dtype = _dtype(module, spec, setup.dims)
    probe = inputs(setup.dims, PROBE_BATCH, setup.length, setup.length, setup.dtype, 1)
    if not conv.deterministic(module, spec, probe, setup.tol):  # e.g. F.dropout(..., training=True)
        report.verdict, report.reason = "fail", say("random", report.lang)
        report.conventions = _conventions(spec, setup.dtype)[:1]
        return report
    found = setup.hints.layout or conv.detect_layout(module, spec, probe, setup.tol)
    if found:
        spec.layout = found
        return _check_in_layout(module, spec, setup, report)
    # Batch elements are not independent (e.g. a softmax over the batch): keep the layout that fits.
    tried, first_error = [], None
    for layout in ("batch", "seq"):
        trial = CheckReport(target=report.target, lang=report.lang)
        try:
            trial_spec = CallSpec(**{**spec.__dict__, "layout": layout})
            tried.append(_check_in_layout(module, trial_spec, setup, trial))
        except LearnerError as error:
            first_error = first_error or error
    if not tried:
        raise first_error
    best = min(tried, key=lambda r: (not r.passed, r.bug is None, math.inf if r.error is None else r.error))
    best.notes.append(say("layout-guess", best.lang))
    return best


def _check_in_layout(module, spec: CallSpec, setup: Setup, report) -> CheckReport:
    """Everything after the layout: causality, lengths, mask convention, roles, verdict."""
    dims, dtype, L = setup.dims, setup.dtype, setup.length
    Lk = _detect_call_conventions(module, spec, setup)
    plain = plain_cases(dims, dtype, L, Lk)
    assignments = _role_candidates(module, spec, setup.heads, plain[0])
    if assignments and spec.mask_param and spec.encoding is None:  # blocked keys not inert: masked after softmax?
        spec.encoding, spec.mask_ignored = encoding_by_agreement(
            module, spec, assignments, plain, lambda trial: masked_cases(trial, dims, dtype, L, Lk), setup.tol)
    report.conventions = _conventions(spec, dtype)
    if not assignments:
        report.reason = say("no-roles", report.lang)
        return report
    return _verdict(module, spec, assignments, plain + masked_cases(spec, dims, dtype, L, Lk), setup.tol, report)


def _detect_call_conventions(module, spec: CallSpec, setup: Setup) -> int:
    """Fill in spec's causality, causal buffer, Lq != Lk support and mask encoding; return the key length."""
    dims, dtype, tol, L = setup.dims, setup.dtype, setup.tol, setup.length
    if setup.hints.causal is None:
        spec.causal = conv.detect_causal(module, spec, inputs(dims, 2, 6, 6, dtype, 2), tol)
    spec.causal_buffer = conv.causal_buffer(module)
    Lk = L if setup.square or spec.causal or setup.context_limited else L + 2
    spec.cross_lengths = Lk != L and conv.accepts_cross_lengths(module, spec,
                                                                inputs(dims, PROBE_BATCH, L, Lk, dtype, 3))
    Lk = Lk if spec.cross_lengths else L
    if spec.mask_param:
        spec.encoding = detect_encoding(module, spec, inputs(dims, PROBE_BATCH, L, Lk, dtype, 4), tol)
    return Lk


def _role_candidates(module, spec: CallSpec, heads: int | None, case) -> list:
    """The role assignments that fit what each Linear sees during one call on ``case`` (xq, xk, xv, keep)."""
    tags = dict(zip({"x": "x", "q_kv": "qk", "qkv": "qkv"}[spec.inputs], case[:3]))  # tag -> its input
    with LinearInputs(module, tags) as seen:
        invoke(module, spec, *case[:3])
    _materialise_unused_lazy(module)
    return candidate_roles(module, seen.seen, spec.inputs == "x", heads)


def _verdict(module, spec: CallSpec, assignments, cases, tol: float, report) -> CheckReport:
    """PASS when some roles reproduce the outputs and gradients with the correct maths; else FAIL, naming
    the catalogue bug whose variant reproduces them (if one does)."""
    with torch.no_grad():
        wanted = [invoke(module, spec, *case) for case in cases]
    match = closest(module, spec, assignments, cases, wanted, [None])
    report.verdict, report.error = "fail", match.error
    if match.error <= tol:
        report.error, report.grad_error = compare_with_reference(module, spec, match.roles, cases)
        if max(report.error, report.grad_error) <= tol:
            report.verdict = "pass"
    else:
        bug = closest(module, spec, assignments, cases, wanted, forms_to_try(spec.encoding is not None, spec.causal))
        if bug.error <= tol:
            report.bug, match = bug.bug_id, bug
    report.roles = match.roles.describe()
    weights = match.roles.weights(module)
    report.conventions.append(("heads", {"heads": weights.num_heads, "head_dim": weights.head_dim}))
    if weights.num_kv_heads != weights.num_heads:
        report.conventions.append(("kv-heads", {"kv_heads": weights.num_kv_heads}))
    return report


def _materialise_unused_lazy(module) -> None:
    """A LazyLinear never called (an unused output layer) gets weights: in_features = out_features."""
    for layer in module.modules():
        if isinstance(layer, nn.modules.lazy.LazyModuleMixin) and layer.has_uninitialized_params():
            ready = [p for p in module.parameters() if not isinstance(p, nn.UninitializedParameter)]
            dtype = ready[0].dtype if ready else torch.float32
            layer(torch.zeros(1, layer.out_features, dtype=dtype))


def _conventions(spec: CallSpec, dtype) -> list[tuple[str, dict]]:
    """The report's (text key, values) lines for what was found."""
    args = spec.args + ([spec.mask_param] if spec.mask_param else [])
    found = [(f"inputs:{spec.inputs}", {"args": ", ".join(args)}), (f"layout:{spec.layout}", {})]
    buffer = f" (buffer '{spec.causal_buffer}')" if spec.causal_buffer else ""
    found.append(("causal:yes" if spec.causal else "causal:no", {"buffer": buffer}))
    if spec.mask_param is None:
        found.append(("mask:none", {}))
    elif spec.encoding is None:
        found.append(("mask:unknown", {"param": spec.mask_param}))
    elif spec.mask_ignored:
        found.append(("mask:ignored", {"param": spec.mask_param}))
    else:
        found.append((spec.encoding.kind, {"param": spec.mask_param, "shape": spec.encoding.shape}))
    if spec.inputs != "x":
        found.append(("cross-lengths" if spec.cross_lengths else "cross-lengths:equal", {}))
    if dtype == torch.float32:
        found.append(("dtype:float32", {}))
    return found


def _diagnose_exception(raised: LearnerError, module, spec, setup: Setup, report) -> None:
    """Name the bug behind an exception, or report the exception and where it happened."""
    report.verdict = "fail"
    report.exception = f"{type(raised.error).__name__}: {str(raised.error).splitlines()[0]}"
    if raised.where:
        report.exception += f" ({raised.where})"
    report.conventions = _conventions(spec, torch.float32)[:1]  # only the signature is known for sure
    dtype = next((p.dtype for p in module.parameters()), torch.float32)
    case = (*inputs(setup.dims, PROBE_BATCH, 5, 7 if spec.inputs != "x" else 5, dtype, 10), None)
    weights = random_weights(setup.dims, setup.dims[0], setup.heads or 1, dtype)
    form = match_exception(raised.error, weights, spec, case)
    if form is not None:
        report.bug = BUG_OF_FORM[form].id
    elif raised.mask_none:
        report.notes.append(say("mask-required", report.lang, param=raised.mask_none))
