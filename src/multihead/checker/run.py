"""``check``: load and build the module, find its layout, then hand over to ``verdict.check_in_layout``.

The whole pipeline is described in ``multihead/checker/__init__.py``. Here: build the module (eval mode,
dropout off, fresh random projection weights, float64 when it runs in float64), read its forward
signature, check that it is deterministic, find its layout. When its own code raises, the checker
retries with Lq = Lk = head_dim (where a missing key transpose still runs) before diagnosing the
exception; when the measured scale fits two mistakes at this head count, it rebuilds the class with
another head count to tell them apart.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import io
import math
from collections.abc import Mapping
from dataclasses import replace

import torch
from torch import nn

from multihead.checker.behaviour import layout as conv
from multihead.checker.loading.calling import CallSpec, LearnerError, invoke, read_signature
from multihead.checker.bugs.catalogue import BUG_OF_FORM
from multihead.checker.loading.config import GuessedConfig
from multihead.checker.bugs.diagnose import match_exception, random_weights
from multihead.checker.loading.forward_args import choose_sizes
from multihead.checker.targets.functions import describe_function, function_class, is_function_target
from multihead.checker.loading.call_hints import Hints, apply_hints, parse_hints
from multihead.checker.loading.learner_file import (
    LoadError,
    build,
    load_target,
    misspelled_forward,
    named_values,
    parse_config,
    parse_init,
    size_values,
    switched_on,
    with_head_count,
)
from multihead.checker.targets.latent_switch import SWITCHED, AbsorbedTwins, find_switch
from multihead.checker.behaviour.mask_convention import all_keep_encoding
from multihead.checker.loading.constructor_args import (
    EMBED,
    EMBED_NAMES,
    HEAD_NAMES,
    KEY_SIZE_NAMES,
    LENGTH_NAMES,
    QUERY_SIZE_NAMES,
    VALUE_SIZE_NAMES,
    is_head_count_name,
)
from multihead.checker.behaviour.find_options import intended, randomise_extras
from multihead.checker.loading.probes import PROBE_BATCH, inputs, randomise_projections
from multihead.checker.bugs.report import CheckReport
from multihead.checker.roles.assign import linear_layers
from multihead.checker.targets.sparse import check_sparse, sparse_kind
from multihead.checker.behaviour.rotary import bases
from multihead.checker.bugs.sentences import bug_name, check_lang, say
from multihead.checker.verdict import Setup, check_in_layout, conventions


def check(target, *, init=None, config=None, call=None, lang: str = "en") -> CheckReport:
    """Check a multi-head attention module: ``target`` is a "file.py:Class" string, a class or an
    instance (never modified: the checker works on a copy), or an attention function ("file.py:function"
    or the function itself, ``functions.py``; a token-sparse attention or top-k selection function is judged
    as one, ``sparse.py``). ``init``: constructor kwargs (dict or
    JSON text); ``config``: attributes of a config object for ``__init__(self, config)`` (dict or JSON
    text; unnamed ones are guessed); ``call``: hints like "heads=4,layout=seq"; ``lang``: "en" or "zh"."""
    lang = check_lang(lang)
    threads = torch.get_num_threads()
    printed = io.StringIO()
    torch.set_num_threads(1)  # the probes are tiny: one thread is many times faster than a pool
    try:  # the learner's debugging prints stay out of the report; the caller's random state is kept
        with contextlib.redirect_stdout(printed), torch.random.fork_rng(devices=[]):
            report = _check(target, init, config, call, lang)
    finally:
        torch.set_num_threads(threads)
    if printed.getvalue():
        report.notes.append(say("printed", lang))
    return report


def _check(target, init, config, call, lang: str) -> CheckReport:
    report = CheckReport(target=_target_name(target), lang=lang)
    try:
        target = load_target(target) if isinstance(target, str) else target
        kind = sparse_kind(target) if is_function_target(target) else None
        if kind:  # sparse attention or top-k selection: judged as a function (sparse.py)
            return check_sparse(target, kind, report)
        module, kwargs, rebuild, notes = _resolve(target, init, config)
        hints = parse_hints(call)
    except LoadError as error:
        report.reason = error.text(lang)
        return report
    twins = SWITCHED.get(module)
    try:
        report = _check_built(module, kwargs, hints, report)
        if hasattr(type(module), "checked_function"):  # a plain function, checked inside a module (functions.py)
            describe_function(report, type(module))
        configs = [v for v in kwargs.values() if isinstance(v, GuessedConfig)]
        report.notes[:0] = [say("switched-on", lang, name=name) for name in notes] + [
            say("config-read", lang, values=", ".join(f"{k}={v!r}" for k, v in c.values().items())) for c in configs]
        if report.ambiguous:
            _tell_scales_apart(report, rebuild, hints)
        return report
    except Exception as error:  # a module the checker cannot handle: say so, never a traceback
        report.verdict, report.bug = "error", None
        report.reason = say("internal", lang, error=f"{type(error).__name__}: {error}")
        return report
    finally:
        if twins is not None:
            twins.switch.release()


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


def _tell_scales_apart(report: CheckReport, rebuild, hints: Hints) -> None:
    """The measured scale fits two mistakes at this head count (H = 4: 1/sqrt(4 D) = 1/(2 sqrt(D))):
    check the class again with another head count and keep the id that still fits. The report lists the
    mistakes, one per line, then says which one the rebuilt module shows (or how to tell them apart)."""
    lang, ambiguous = report.lang, report.ambiguous
    sizes = next((values for key, values in report.conventions if key == "heads"), None)
    report.ambiguous = []
    report.notes.append(say("scale-same", lang, **sizes) if sizes else say("scale-same-here", lang))
    report.notes.extend(f"- {bug_name(bug, lang)}" for bug in ambiguous)
    for heads in (2, 8, 3, 1) if rebuild else ():  # an instance cannot be rebuilt
        built = rebuild(heads)
        if built is None:
            continue
        module, kwargs = built
        other = _check_built(module, kwargs, replace(hints, heads=None),
                             CheckReport(target=report.target, lang=lang))
        if other.bug in ambiguous and not other.ambiguous:
            report.bug = other.bug
            report.notes.append(say("scale-rebuilt", lang, heads=heads, bug=other.bug))
            return
    report.notes.append(say("scale-ambiguous", lang))


def _say_after_rename(method: str, inner: CheckReport) -> str:
    """What the rest of the check found once ``method`` is used as forward."""
    if inner.passed:
        return say("after-rename-pass", inner.lang, method=method)
    if inner.bug:
        return say("after-rename-bug", inner.lang, method=method, bug=bug_name(inner.bug, inner.lang))
    return say("after-rename", inner.lang, method=method, verdict=inner.headline())


def _target_name(target) -> str:
    if isinstance(target, str):
        return target
    cls = target if isinstance(target, type) or is_function_target(target) else type(target)
    return cls.__name__


def _resolve(target, init, config) -> tuple[nn.Module, dict, object, list[str]]:
    """(a module instance the checker may change, the constructor kwargs, rebuild(heads) -> (module,
    kwargs) or None: the same class built with another head count, None for an instance; the scale
    switches turned on)."""
    if isinstance(init, Mapping):
        kwargs = dict(init)
    elif isinstance(init, (str, type(None))):
        kwargs = parse_init(init)
    else:
        raise LoadError(f"init must be a dict of keyword arguments or its JSON text, got {type(init).__name__}",
                        f"init 必须是关键字参数的 dict 或其 JSON 文本，实际是 {type(init).__name__}")
    config = parse_config(config)
    if isinstance(target, nn.Module):
        try:
            return copy.deepcopy(target).cpu(), kwargs, None, []
        except Exception as error:  # e.g. a module holding an open file or a generator
            why = f"{type(error).__name__}: {error}"
            raise LoadError(f"cannot copy the module to check it ({why}); pass its class instead",
                            f"无法复制这个模块来检查（{why}）；请改为传入它的类") from error
    cls = function_class(target) if is_function_target(target) else target
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise LoadError(f"expected an nn.Module class or instance, got {type(target).__name__}",
                        f"需要 nn.Module 的类或实例，实际是 {type(target).__name__}")
    switch = find_switch(cls)
    if switch is None:
        module, built_with = build(cls, kwargs, config)
    else:  # an MLA whose file picks its form: check the naive one, its absorbed twin beside it
        switch.hold()
        module, built_with = build(cls, kwargs, config)
        SWITCHED[module] = AbsorbedTwins(switch, lambda: cls(**built_with))

    def rebuild(heads: int):
        changed = with_head_count(built_with, heads)
        try:
            return None if changed is None else (cls(**changed), changed)
        except Exception:
            return None

    return module, built_with, rebuild, switched_on(cls, kwargs, built_with)


def _heads_hint(module, kwargs, hints: Hints) -> int | None:
    """The number of heads from --call, the constructor arguments (head_count... included) or the
    module's attributes."""
    named = [n for n in size_values(kwargs) if is_head_count_name(n)]
    return hints.heads or _size(HEAD_NAMES + tuple(named), kwargs, module)


def _size(names, kwargs: dict, module=None) -> int | None:
    """The first positive int among the arguments ``names`` (config attributes included; then the
    module's attributes), or None."""
    values = size_values(kwargs)
    found = [values.get(n) for n in names] + [getattr(module, n, None) for n in names if module is not None]
    return next((v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0), None)


def _input_dims(module, kwargs) -> tuple[int, int, int]:
    """(Eq, Ek, Ev): the query's from a size argument (query_size, d_model...), else the first projection;
    the key's and value's from key_size/kdim and value_size/vdim (arguments or attributes), else Eq."""
    first = next(iter(linear_layers(module).values()), None)
    named = named_values(type(module), kwargs)  # defaults too: cross_attention_dim=12 left as it is
    query = _size(QUERY_SIZE_NAMES + EMBED_NAMES, kwargs) or _size(QUERY_SIZE_NAMES + EMBED_NAMES, named) or \
        (first.in_features if first else EMBED)
    key = _size(KEY_SIZE_NAMES, kwargs, module) or _size(KEY_SIZE_NAMES, named) or query
    value = _size(VALUE_SIZE_NAMES, kwargs, module) or _size(VALUE_SIZE_NAMES, named) or query
    return query, key, value


def _check_module(module, kwargs, hints, report, square: int | None = None) -> CheckReport:
    """Check a built module; when its code raises, retry once with Lq = Lk = head_dim, then diagnose."""
    module.eval()
    spec = apply_hints(read_signature(module.forward), hints)
    named = named_values(type(module), kwargs)
    setup = Setup(_input_dims(module, kwargs), _heads_hint(module, kwargs, hints), hints,
                  any(name in size_values(kwargs) for name in LENGTH_NAMES), square, rope_bases=bases(module, named),
                  intended=intended(module, named), named=named)
    if any(isinstance(m, nn.modules.lazy.LazyModuleMixin) for m in module.modules()):
        try:  # materialise LazyLinear with one float32 call
            invoke(module, spec, *inputs(setup.dims, PROBE_BATCH, 5, 5, torch.float32, 0))
        except LearnerError:
            pass
    if square is None:
        randomise_projections(linear_layers(module))
        randomise_extras(module, linear_layers(module))
    if spec.mask_required:
        _stand_in_for_no_mask(module, spec, setup, report)
    try:
        return _check_running(module, spec, setup, report)
    except LearnerError as raised:
        _diagnose_exception(raised, module, spec, setup, report)
        head_dim = (setup.dims[0] // setup.heads) if setup.heads else None
        if square is None and not report.bug and head_dim and head_dim >= 2 and head_dim != PROBE_BATCH:
            retry = _check_module(module, kwargs, hints, CheckReport(target=report.target, lang=report.lang),
                                  square=head_dim)
            if retry.verdict == "fail" and retry.bug:  # e.g. q @ k, which only runs when L == D
                retry.exception, retry.where = report.exception, report.where
                return retry
        return report


def _stand_in_for_no_mask(module, spec: CallSpec, setup: Setup, report) -> None:
    """A mask the module requires (it raises on None): unmasked calls pass an all-keep mask in its own
    convention instead (``spec.none_mask``), and the report says so."""
    probe = inputs(setup.dims, PROBE_BATCH, setup.length, setup.length, next(
        (p.dtype for p in module.parameters()), torch.float32), 0)
    try:
        invoke(module, spec, *probe)
        return
    except LearnerError as raised:
        if not raised.mask_none:
            return
    spec.none_mask = all_keep_encoding(module, spec, probe)
    if spec.none_mask is not None:
        report.notes.append(say("mask-filled-in", report.lang, param=spec.mask_param))


def _dtype(module, spec, setup: Setup) -> torch.dtype:
    """float64 when the module runs in float64 (its own float32 constants may forbid it); the sizes of the
    rotary tables it is handed (``fillers.choose_sizes``) are chosen in that dtype."""
    for dtype, convert in ((torch.float64, module.double), (torch.float32, module.float)):
        convert()
        probe = inputs(setup.dims, PROBE_BATCH, 5, 5, dtype, 0)

        def runs(probe=probe) -> bool:
            try:
                invoke(module, spec, *probe)
                return True
            except LearnerError:
                return False

        choose_sizes(spec.fillers, runs, setup.dims[0], setup.heads, setup.named)
        if dtype == torch.float32 or runs():
            return dtype
    return torch.float32


def _check_running(module, spec: CallSpec, setup: Setup, report) -> CheckReport:
    """Conventions, roles, then the verdict (the learner's exceptions propagate as LearnerError)."""
    setup.dtype = _dtype(module, spec, setup)
    probe = inputs(setup.dims, PROBE_BATCH, setup.length, setup.length, setup.dtype, 1)
    if not conv.deterministic(module, spec, probe, setup.tol):  # e.g. F.dropout(..., training=True)
        report.verdict, report.reason = "fail", say("random", report.lang)
        report.conventions = conventions(spec, setup.dtype)[:1]
        return report
    found = setup.hints.layout or conv.detect_layout(module, spec, probe, setup.tol)
    if found:
        spec.layout = found
        return check_in_layout(module, spec, setup, report)
    # Batch elements are not independent (e.g. a softmax over the batch): keep the layout that fits.
    tried, first_error = [], None
    for layout in ("batch", "seq"):
        trial = CheckReport(target=report.target, lang=report.lang)
        try:
            trial_spec = CallSpec(**{**spec.__dict__, "layout": layout})
            tried.append(check_in_layout(module, trial_spec, setup, trial))
        except LearnerError as error:
            first_error = first_error or error
    if not tried:
        raise first_error
    best = min(tried, key=lambda r: (not r.passed, r.bug is None, math.inf if r.error is None else r.error))
    best.notes.append(say("layout-guess", best.lang))
    return best


def meant_attribute(error: BaseException) -> tuple[str, str] | None:
    """(the missing name, the tensor method it is closest to) for ``'Tensor' object has no attribute 'mask_fill'``."""
    if not isinstance(error, AttributeError) or not str(error).startswith("'Tensor' object has no attribute"):
        return None
    name = getattr(error, "name", None) or str(error).rsplit("'", 2)[-2]
    close = difflib.get_close_matches(name, [n for n in dir(torch.Tensor) if not n.startswith("_")], n=1)
    return (name, close[0]) if close else None


def _diagnose_exception(raised: LearnerError, module, spec, setup: Setup, report) -> None:
    """Name the bug behind an exception, or report the exception and where it happened."""
    report.verdict = "fail"
    report.exception = f"{type(raised.error).__name__}: {(str(raised.error).splitlines() or [''])[0]}"
    report.where = raised.where
    meant = meant_attribute(raised.error)
    if meant:
        report.notes.append(say("did-you-mean", report.lang, name=meant[0], meant=meant[1]))
    if raised.with_mask:
        report.notes.append(say("raises-with-mask", report.lang, param=spec.mask_param))
    report.conventions = conventions(spec, torch.float32)[:1]  # only the signature is known for sure
    dtype = next((p.dtype for p in module.parameters()), torch.float32)
    case = (*inputs(setup.dims, PROBE_BATCH, 5, 7 if spec.inputs != "x" else 5, dtype, 10), None)
    weights = random_weights(setup.dims, setup.dims[0], setup.heads or 1, dtype)
    form = match_exception(raised.error, weights, spec, case)
    if form is not None:
        report.bug = BUG_OF_FORM[form].id
    elif raised.mask_none:
        report.notes.append(say("mask-required", report.lang, param=raised.mask_none))
