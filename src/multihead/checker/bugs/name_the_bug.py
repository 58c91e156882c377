"""Name the bug once the correct maths does not reproduce the learner's outputs (steps 2-7 of
``verdict.py``'s docstring): a catalogue form, a causal buffer used after the softmax, a measured scale,
a form together with a wrong scale, a form named from the unmasked outputs; then the mask convention
re-read under that bug, and the roles ordered by their names when no variant fits.
"""

from __future__ import annotations

import torch

from multihead.checker.loading.calling import CallSpec, LearnerError, invoke
from multihead.checker.bugs.catalogue import BLOCKED_FILL, NEEDS_MASK, forms_to_try
from multihead.checker.bugs.diagnose import Match, closest
from multihead.checker.behaviour.mask_convention import ENCODINGS, LENGTHS, MASK_KINDS
from multihead.checker.behaviour.scale import measure_scale
from multihead.checker.bugs.sentences import bug_name, say


def name_the_bug(module, spec: CallSpec, assignments, cases, wanted, tol: float, report):
    """The match that names the bug (steps 2-4 of the module docstring), with report.bug set; or None."""
    bug = closest(module, spec, assignments, cases, wanted, forms_to_try(spec.encoding is not None, spec.causal))
    if bug.error <= tol:
        return _named(bug, report)
    causal = CallSpec(**{**spec.__dict__, "causal": True})  # a tril buffer the behaviour did not show as
    if not spec.causal and (spec.causal_buffer or spec.causal_built):  # causal: weights zeroed after the softmax, or a bug that
        bug = closest(module, causal, assignments, cases, wanted,  # mixes every position
                      forms_to_try(spec.encoding is not None, True))
        if bug.error <= tol:
            return _named_through_buffer(bug, spec, report)
    masked = spec.causal or any(case[3] is not None for case in cases)
    fills = (-float("inf"), BLOCKED_FILL) if masked else (-float("inf"),)
    scale = measure_scale(module, spec, assignments, cases, wanted, tol, fills)
    if scale is not None:
        report.bug, report.ambiguous = scale.bug, scale.ambiguous
        report.notes.append(say("scale-measured", report.lang, measured=scale.scale, right=scale.right))
        return Match(None, scale.roles, -float("inf"), scale.error, scale.scale)
    for form in forms_to_try(spec.encoding is not None, spec.causal):  # two bugs: a form and a wrong scale
        if form in ("scale-after-softmax", "scores-q-times-k", "merge-by-view"):
            continue
        scale = measure_scale(module, spec, assignments, cases, wanted, tol, fills, form)
        if scale is not None:
            match = Match(form, scale.roles, fills[0], scale.error, scale.scale)
            report.notes.append(say("also-scale", report.lang, bug=bug_name(scale.bug, report.lang),
                                    measured=scale.scale, right=scale.right))
            return _named(match, report)
    unmasked = [i for i, case in enumerate(cases) if case[3] is None]
    if len(unmasked) == len(cases):
        return None
    # masked outputs can mix two fills (a finite causal one, an additive -inf mask): name it without a mask
    plain, plain_wanted = [cases[i] for i in unmasked], [wanted[i] for i in unmasked]
    for trial in [spec] + ([causal] if not spec.causal and (spec.causal_buffer or spec.causal_built) else []):
        bug = closest(module, trial, assignments, plain, plain_wanted, forms_to_try(False, trial.causal))
        if bug.error <= tol:
            causal = spec.causal or bool(spec.causal_buffer) or spec.causal_built  # only a causal module has a causal fill to ask about
            report.notes.append(say("named-without-mask-causal" if causal else "named-without-mask", report.lang))
            return _named_through_buffer(bug, spec, report) if trial is causal else _named(bug, report)
    return None


def mask_under_bug(module, spec: CallSpec, match, plain, make_masked, tol: float, report) -> None:
    """A bug that mixes tokens or positions (a split without transpose, the wrong softmax axis) keeps
    blocked keys from being inert, so the convention found first may be wrong: keep the one under which
    the named bug reproduces the masked outputs too (finite ones), and describe that one; none fits: say
    the convention is unconfirmed rather than describe a guess."""
    found = None
    for encoding in [e for e in [spec.encoding] + ENCODINGS + LENGTHS if e is not None]:
        trial = CallSpec(**{**spec.__dict__, "encoding": encoding})
        try:
            cases = make_masked(trial)
            with torch.no_grad():
                got = [invoke(module, trial, *case) for case in cases]
        except LearnerError:
            continue
        if all(torch.isfinite(g).all() for g in got) and \
                closest(module, trial, [match.roles], cases, got, [match.form], match.scale).error <= tol:
            found = encoding
            break
    report.notes = [note for note in report.notes if note not in (say("named-without-mask", report.lang),
                                                                  say("named-without-mask-causal", report.lang))
                    or found is None]
    spec.encoding = found or spec.encoding
    line = (found.kind, {"param": spec.mask_param, "shape": found.shape}) if found else \
        ("mask:unconfirmed", {"param": spec.mask_param})
    report.conventions = [line if key in MASK_KINDS or key == "mask:unknown" else (key, values)
                          for key, values in report.conventions]


def _named(bug, report):
    report.bug = bug.bug_id
    return bug


def _named_through_buffer(bug, spec: CallSpec, report):
    """The bug, found with the causal buffer applied: the report says how the buffer is used."""
    after = bug.form in NEEDS_MASK
    if spec.causal_buffer:
        line = ("causal:after-softmax" if after else "causal:yes-buffer", {"buffer": spec.causal_buffer})
    else:  # a causal mask built in forward
        line = ("causal:built-after-softmax" if after else "causal:built", {})
    report.conventions = [line if key == "causal:no" else (key, values) for key, values in report.conventions]
    return _named(bug, report)


_ROLE_WORDS = {"q": ("q", "query", "queries"), "k": ("k", "key", "keys"), "v": ("v", "value", "values")}


def by_names(assignments, closest_roles):
    """Among the assignments with the closest one's head count, the one whose projection names say their
    roles (``q_proj``, ``to_k``, ``values``...); the closest one when names say nothing."""
    def said(roles) -> int:
        words = {role: {w for proj, _ in roles.pieces[role] for w in proj.name.lower().replace(".", "_").split("_")}
                 for role in _ROLE_WORDS}
        return sum(bool(words[role] & set(names)) for role, names in _ROLE_WORDS.items())

    same = [a for a in assignments if a.num_heads == closest_roles.num_heads]
    best = max(same, key=said, default=closest_roles)
    return best if said(best) > said(closest_roles) else closest_roles
