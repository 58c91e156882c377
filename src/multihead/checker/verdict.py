"""Once the layout is known: argument order, causality, mask convention, roles, then the verdict.

A module with an absorbed path whose Linears fit multi-head latent attention's roles gets its own
verdict instead (``targets/latent.py``). Otherwise, in order (each step only when the previous ones did not
explain the outputs):

1. some role assignment reproduces the outputs with the correct maths -> forward + gradient comparison
   with ``MultiHeadAttention`` (``compare.py``) -> PASS; for self-attention, with q and k turned by RoPE
   in either pairing when plain maths does not fit (``rotary.py``; mixed pairings are bugs), and with the
   module's KV cache driven step by step after the PASS (``targets/kv_cache.py``);
2. a catalogue form reproduces them -> FAIL with that bug (``diagnose.closest``);
3. a causal buffer applied after the softmax (weights zeroed through ``tril``) -> mask-after-softmax;
4. a measured scale other than 1/sqrt(D) reproduces them -> the scale bug it names (``scale.py``);
5. a catalogue form together with a measured wrong scale (two bugs: the form is named, the scale noted);
6. a catalogue form reproduces the outputs without a mask (the masked ones may mix two fill values);
7. otherwise an unknown difference, with its measured error.

A mask argument whose convention could not be verified never ends in PASS (``mask-unverified``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from multihead.checker.behaviour import layout as conv
from multihead.checker.loading.calling import CallSpec, LearnerError, invoke
from multihead.checker.bugs.catalogue import MASK_BUGS, forms_to_try
from multihead.checker.compare import compare_with_reference
from multihead.checker.core.judge import judge_unknown, stage_lines
from multihead.checker.bugs.diagnose import Match, closest
from multihead.checker.loading.call_hints import Hints
from multihead.checker.targets.kv_cache import check_cached
from multihead.checker.targets.latent import check_latent
from multihead.checker.behaviour.mask_meaning import judge_mask, mask_replaces_causal
from multihead.checker.behaviour.mask_convention import causal_switch, detect_encoding, encoding_by_agreement, tried_text
from multihead.checker.bugs.name_the_bug import by_names, mask_under_bug, name_the_bug
from multihead.checker.behaviour.find_options import describe, find_window, intended_bug, one_dimensional, search
from multihead.checker.behaviour.options import Options
from multihead.checker.roles.argument_order import find_order
from multihead.checker.loading.probes import PROBE_BATCH, inputs, masked_cases, plain_cases
from multihead.checker.roles.projections import ProjectionInputs, describe_seen
from multihead.checker.roles.assign import candidate_roles, linear_layers
from multihead.checker.behaviour.rotary import DEFAULT_BASE, ROPE_TOLERANCE, rotaries
from multihead.checker.bugs.sentences import say
from multihead.checker.behaviour.unused_mask import applies_causal_mask, unused_causal_mask

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}  # relative, see compare.relative_error


@dataclass
class Setup:
    """What every step needs besides the module and its CallSpec."""

    dims: tuple[int, int, int]  # (Eq, Ek, Ev)
    heads: int | None  # from hints, arguments or attributes; None = find by behaviour
    hints: Hints
    context_limited: bool  # built with a context length: probes stay within 6 tokens, Lq = Lk
    square: int | None = None  # Lq = Lk = head_dim (the retry after an exception), else None
    dtype: torch.dtype = torch.float64
    rope_bases: tuple[float, ...] = (DEFAULT_BASE,)  # the RoPE wavelength bases to try (rotary.bases)
    intended: dict = field(default_factory=dict)  # what the constructor names (option_search.intended)
    named: dict = field(default_factory=dict)  # the constructor's named values (load.named_values)

    @property
    def tol(self) -> float:
        return TOLERANCE[self.dtype]

    @property
    def length(self) -> int:
        return self.square or 5


def check_in_layout(module, spec: CallSpec, setup: Setup, report):
    """Everything after the layout: argument order, causality, lengths, mask convention, roles, verdict."""
    dims, dtype, L = setup.dims, setup.dtype, setup.length
    if setup.hints.inputs is None:
        spec.order, spec.order_found = find_order(module, spec, dims, dtype, setup.tol)
    Lk = _detect_call_conventions(module, spec, setup)
    if check_latent(module, spec, setup, report, conventions(spec, dtype)):  # MLA: its own verdict (targets/latent.py)
        return report
    plain = plain_cases(dims, dtype, L, Lk)
    assignments, seen = _role_candidates(module, spec, setup.heads, plain[0])
    if assignments and spec.mask_param and spec.encoding is None:  # blocked keys not inert: masked after softmax?
        fitting, tol = _fitting(module, spec, assignments, plain, setup)
        spec.encoding, spec.mask_ignored = encoding_by_agreement(
            module, spec, fitting, plain, lambda trial: masked_cases(trial, dims, dtype, L, Lk), tol)
    report.conventions = conventions(spec, dtype)
    if not assignments:  # no projection roles: the core on its own tensors may still judge it
        report.verdict = "fail"
        judge_unknown(module, spec, dims, dtype, report, heads=setup.heads)
        if report.verdict == "pass":
            report.conventions.append(("heads", {"heads": report.bug_values.pop("heads"),
                                                 "head_dim": report.bug_values.pop("head_dim")}))
            report.notes.append(say("no-roles-core", report.lang))
        elif report.stage is None or report.stage.stage is None:  # nothing in the core differs: cannot judge
            right = [] if report.stage is None else stage_lines(report.stage, report.lang)
            report.verdict, report.stage, report.notes = "error", None, []
            report.reason = " ".join([say("no-roles", report.lang, seen=seen)] + right)
        return report
    return _verdict(module, spec, assignments, plain, lambda trial: masked_cases(trial, dims, dtype, L, Lk),
                    setup.tol, report, setup.rope_bases, setup.heads)


def _fitting(module, spec: CallSpec, assignments, plain, setup: Setup) -> tuple[list, float]:
    """(the assignments, turned by RoPE when plain maths does not reproduce the unmasked outputs and a rotation
    does, and the tolerance that goes with them): what the masked outputs are then compared against."""
    if spec.inputs != "x":
        return assignments, setup.tol
    with torch.no_grad():
        wanted = [invoke(module, spec, *case) for case in plain]
    if closest(module, spec, assignments, plain, wanted, [None]).error <= setup.tol:
        return assignments, setup.tol
    match, turned = _rope_match(module, spec, assignments, plain, wanted, setup.rope_bases)
    return (turned, max(setup.tol, ROPE_TOLERANCE)) if match.error <= ROPE_TOLERANCE else (assignments, setup.tol)


def _option_match(module, spec: CallSpec, assignments, cases, wanted, tol: float, rope_bases, report):
    """(match, assignments, tolerance) under the options the module was found to use (behaviour/find_options.py),
    with ``spec.options`` set to them; None when it shows no sign of any."""
    found = search(module, spec, assignments, cases, wanted, tol, rope_bases,
                   one_dimensional(module, linear_layers(module)))
    if found is None:
        return None
    spec.options = found.options
    rotated = found.match.roles is not None and found.match.roles.rope is not None
    return found.match, found.assignments, max(tol, ROPE_TOLERANCE) if rotated else tol


def _detect_call_conventions(module, spec: CallSpec, setup: Setup) -> int:
    """Fill in spec's causality, causal buffer, Lq != Lk support and mask encoding; return the key length."""
    dims, dtype, tol, L = setup.dims, setup.dtype, setup.tol, setup.length
    if setup.hints.causal is None:
        spec.causal = conv.detect_causal(module, spec, inputs(dims, 2, 6, 6, dtype, 2), tol)
    spec.causal_buffer = conv.causal_buffer(module)
    if not spec.causal and spec.causal_buffer is None and spec.inputs == "x":
        spec.causal_built = applies_causal_mask(module, spec, inputs(dims, 2, 6, 6, dtype, 2)[0])
    window = None if setup.context_limited or setup.square else find_window(module, spec, dims, dtype, tol)
    spec.options = Options(window=window, intended=setup.intended)
    Lk = L if setup.square or spec.causal or setup.context_limited else L + 2
    spec.cross_lengths = Lk != L and conv.accepts_cross_lengths(module, spec,
                                                                inputs(dims, PROBE_BATCH, L, Lk, dtype, 3))
    Lk = Lk if spec.cross_lengths else L
    if spec.mask_param:
        probe = inputs(dims, PROBE_BATCH, L, Lk, dtype, 4)
        # a mask whose presence alone makes it causal (its values unread) first: its blocked keys can look inert
        spec.encoding = causal_switch(module, spec, probe, tol) or detect_encoding(module, spec, probe, tol)
        if spec.none_mask is not None and spec.encoding is not None and spec.encoding.family != "causal":
            spec.none_mask = spec.encoding  # "no mask" from now on in the convention the masked probes found
        spec.mask_complete = mask_replaces_causal(module, spec, probe[0], tol)
    return Lk


def _role_candidates(module, spec: CallSpec, heads: int | None, case) -> tuple[list, str]:
    """(the role assignments that fit what each projection sees during one call on ``case`` (xq, xk, xv,
    keep), what each projection read: for the report when none fits)."""
    tags = dict(zip({"x": "x", "q_kv": "qk", "qkv": "qkv"}[spec.inputs], case[:3]))  # tag -> its input
    with ProjectionInputs(module, tags) as seen:
        invoke(module, spec, *case[:3])
    before = seen.transformed_inputs()  # e.g. a LayerNorm inside the module, before the projections
    if before:
        layers = dict(module.named_modules())
        spec.pre = {tag: (name, layers[name]) for tag, name in before.items()}
        with torch.no_grad():
            tags = {tag: spec.pre[tag][1](t) if tag in spec.pre else t for tag, t in tags.items()}
        with ProjectionInputs(module, tags) as seen:
            invoke(module, spec, *case[:3])
    materialise_unused_lazy(module)
    widths = {tag: t.shape[-1] for tag, t in tags.items()}
    found = candidate_roles(module, seen.seen, spec.inputs == "x", heads, widths, watched=seen)
    return found, describe_seen(seen.projections, seen.seen)


def _verdict(module, spec: CallSpec, assignments, plain, make_masked, tol: float, report,
             rope_bases: tuple[float, ...] = (DEFAULT_BASE,), heads: int | None = None):
    """PASS when some roles reproduce the outputs and gradients with the correct maths; else FAIL, naming
    the bug whose variant reproduces them (if one does, ``bugs/name_the_bug.py``). See the module docstring for the order."""
    cases = plain + make_masked(spec)
    with torch.no_grad():
        wanted = [invoke(module, spec, *case) for case in cases]
    match = closest(module, spec, assignments, cases, wanted, [None])
    turned = None
    if match.error > tol and spec.inputs == "x":  # q and k turned by position: RoPE, in which pairing?
        turned = _rope_match(module, spec, assignments, cases, wanted, rope_bases)
        if turned[0].error <= ROPE_TOLERANCE:
            match, assignments, tol = turned[0], turned[1], max(tol, ROPE_TOLERANCE)
            report.bug, turned = match.roles.rope.bug, None
    if match.error > tol and not report.bug:  # QK-norm, sinks, a softcap, partial RoPE?
        optioned = _option_match(module, spec, assignments, cases, wanted, tol, rope_bases, report)
        if optioned is not None:
            match, assignments, tol = optioned
            turned = None if match.error <= tol or match.roles.rope is None else turned
    if match.error <= tol and not report.bug:  # the module measures otherwise than its constructor says
        weights = match.roles.weights()  # its rope: the match's, with the rotary_dim its roles carry
        report.bug, report.bug_values = intended_bug(spec.options, weights.rope, weights.head_dim) or (None, {})
    report.verdict, report.error = "fail", match.error
    if report.bug:  # the rotation's pairing is the bug
        pass
    elif match.error <= tol:
        report.error, report.grad_error = compare_with_reference(module, spec, match.roles, cases)
        if max(report.error, report.grad_error) <= tol:
            report.verdict = "pass"
    else:
        match = name_the_bug(module, spec, assignments, cases, wanted, tol, report) or match
        retry = turned and not report.bug  # no rotation fitted and no bug named yet: RoPE and another bug?
        if retry:  # RoPE and another bug, named under the pairing that fits best
            rotated = _pairings_by_fit(module, spec, assignments, cases, wanted, rope_bases)[0]
            match = name_the_bug(module, spec, rotated, cases, wanted, max(tol, ROPE_TOLERANCE), report) or match
        if report.bug and spec.mask_param and (spec.encoding is None or spec.encoding.family != "causal"):
            mask_under_bug(module, spec, match, plain, make_masked, tol, report)
    judge_mask(module, spec, plain[0][:3], report)  # a mask added with the wrong sign, the caller's claim
    if report.verdict == "fail" and not report.bug and not report.reason:  # the core, on its own tensors
        found = judge_unknown(module, spec, tuple(t.shape[-1] for t in plain[0][:3]), plain[0][0].dtype, report,
                              assignments, heads)
        if found is not None:  # the roles the core read, not the reading that came closest under the bug
            match = Match(match.form, found, match.fill, match.error, match.scale)
    if report.verdict == "pass" and report.kind != "core":
        _check_longer(module, spec, match.roles, plain, tol, report)
    if report.verdict == "pass" and report.kind != "core":  # a module with a KV cache: a prompt, then one token at a time
        check_cached(module, spec, match.roles, tol, report)
    if report.verdict == "pass" and report.kind != "core" and not spec.causal and spec.inputs == "x":  # a causal mask built, then lost?
        built = unused_causal_mask(module, spec, plain[0][0])
        if built is not None:
            report.verdict, report.bug = "fail", "causal-mask-unused"
            if built:
                report.notes.append(say("causal-mask-built", report.lang, where=built))
    if report.verdict == "pass" and spec.mask_param and spec.encoding is None:
        report.verdict, report.reason = "fail", say("mask-unverified", report.lang, param=spec.mask_param,
                                                    tried=tried_text(report.lang))
    elif spec.mask_param and spec.encoding is None and (report.bug is None or report.bug in MASK_BUGS):
        report.notes.append(say("mask-unverified", report.lang, param=spec.mask_param, tried=tried_text(report.lang)))
    if report.verdict == "fail" and not report.bug:  # no variant fits: behaviour cannot order the roles
        match = Match(match.form, by_names(assignments, match.roles), match.fill, match.error, match.scale)
    if report.kind == "core":  # passed on its own tensors: the role search's reading does not hold
        report.conventions.append(("heads", {"heads": report.bug_values.pop("heads"),
                                             "head_dim": report.bug_values.pop("head_dim")}))
        return report
    report.roles = match.roles.describe()
    weights = match.roles.weights(module)
    report.conventions.append(("heads", {"heads": weights.num_heads, "head_dim": weights.head_dim}))
    if weights.num_kv_heads != weights.num_heads:
        report.conventions.append(("kv-heads", {"kv_heads": weights.num_kv_heads}))
    if weights.rope is not None:
        report.conventions.append(("rope:" + ("interleaved" if weights.rope.tables_interleaved else "half"),
                                   {"base": f"{weights.rope.base:g}"}))
    report.conventions += describe(spec.options, weights.rope, weights.head_dim)
    return report


LONGER = (12, 16, 24, 40, 64)  # probe lengths after a PASS at short ones: approximations exact only when short


def _rope_match(module, spec: CallSpec, assignments, cases, wanted, bases):
    """(the closest match, the assignments turned by its Rotary): the first rotation that reproduces the
    outputs (correct pairings first, then mixed ones: a pairing bug), else the closest mixed one."""
    for correct in (True, False):
        turned = [replace(roles, rope=rope) for rope in rotaries(bases, correct) for roles in assignments]
        match = closest(module, spec, turned, cases, wanted, [None])
        if match.error <= ROPE_TOLERANCE:
            break
    return match, [roles for roles in turned if roles.rope == match.roles.rope]


def _pairings_by_fit(module, spec: CallSpec, assignments, cases, wanted, bases) -> list[list]:
    """The assignments turned by each correct pairing (first base), the pairing whose closest catalogue
    form comes nearest the outputs first: a RoPE module with a second bug is named under its own pairing
    (only that one is searched: the other pairing's search costs as much and has never named a bug the
    nearer one missed)."""
    forms = [None] + forms_to_try(spec.encoding is not None, spec.causal)
    turned = [[replace(roles, rope=rope) for roles in assignments] for rope in rotaries(bases[:1], True)[1::2]]
    return sorted(turned, key=lambda rotated: closest(module, spec, rotated, cases, wanted, forms).error)


def _check_longer(module, spec: CallSpec, roles, plain, tol: float, report) -> None:
    """A module that matched on short probes must match at every longer length it runs at (one that
    raises there, e.g. past its context length, is not probed further); the first that differs fails it."""
    dims = tuple(t.shape[-1] for t in plain[0][:3])
    extra = plain[0][1].shape[1] - plain[0][0].shape[1]  # Lk - Lq of the probes
    matched = max(case[0].shape[1] for case in plain)  # the longest length it matched at so far
    for length in LONGER:
        case = [(*inputs(dims, 2, length, length + extra, plain[0][0].dtype, 20 + length), None)]
        try:
            with torch.no_grad():
                wanted = [invoke(module, spec, *case[0])]
        except LearnerError:
            return
        error = closest(module, spec, [roles], case, wanted, [None]).error
        if error > tol:
            report.verdict, report.error = "fail", error
            report.reason = say("wrong-when-longer", report.lang, length=length, shorter=matched, error=error)
            return
        matched = length


def materialise_unused_lazy(module) -> None:
    """A LazyLinear never called (an unused output layer) gets weights: in_features = out_features."""
    for layer in module.modules():
        if isinstance(layer, torch.nn.modules.lazy.LazyModuleMixin) and layer.has_uninitialized_params():
            ready = [p for p in module.parameters() if not isinstance(p, torch.nn.UninitializedParameter)]
            dtype = ready[0].dtype if ready else torch.float32
            layer(torch.zeros(1, layer.out_features, dtype=dtype))


def conventions(spec: CallSpec, dtype) -> list[tuple[str, dict]]:
    """The report's (text key, values) lines for what was found."""
    args = spec.args + [filler.name for filler in spec.fillers] + ([spec.mask_param] if spec.mask_param else [])
    found = [(f"inputs:{spec.inputs}", {"args": ", ".join(args), "call": "forward"})]
    found += [(f"filled:{filler.kind}", {"name": filler.name, "size": filler.size, "half": (filler.size or 0) // 2})
              for filler in spec.fillers]
    if spec.order_found and spec.order not in (None, (0, 1), (0, 1, 2)):
        named = {role: spec.args[p] for p, role in enumerate(spec.order) if p < len(spec.args)}
        found.append((f"order:{spec.inputs}", {"q": named.get(0), "k": named.get(1), "v": named.get(2)}))
    for name, layer in dict(spec.pre.values()).items():
        found.append(("pre", {"name": name, "kind": type(layer).__name__}))
    found.append((f"layout:{spec.layout}", {}))
    causal = ("causal:yes-buffer" if spec.causal_buffer else "causal:yes") if spec.causal else "causal:no"
    found.append((causal, {"buffer": spec.causal_buffer}))
    if spec.mask_param is None:
        found.append(("mask:none", {}))
    elif spec.encoding is None:
        found.append(("mask:unknown", {"param": spec.mask_param}))
    elif spec.mask_ignored:
        found.append(("mask:ignored", {"param": spec.mask_param}))
    else:
        found.append((spec.encoding.kind, {"param": spec.mask_param, "shape": spec.encoding.shape}))
    if spec.mask_complete:
        found.append(("mask-complete", {}))
    if spec.inputs != "x":
        found.append(("cross-lengths" if spec.cross_lengths else "cross-lengths:equal", {}))
    if dtype == torch.float32:
        found.append(("dtype:float32", {}))
    return found

