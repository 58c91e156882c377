"""The learner's mask convention, found by behaviour.

Every convention is an ``Encoding``: it turns a canonical keep pattern (B, Lq, Lk), True = may attend,
into the tensor the learner's forward expects (keep or block, bool or 0/1, additive, labml's
(Lq, Lk, B), d2l's valid_lens...). ``detect_encoding`` tries each one: the right one makes blocked keys
inert (changing them changes no output), which holds even when the module has a bug elsewhere. A trial
that raises or returns a wrong shape (the Annotated Transformer's ``mask.unsqueeze(1)`` turns a 4-D mask
into a 5-D one) only rules that convention out.

Every batch row gets its own mask, so that a mask applied to the wrong rows shows. A mask shared by
the whole batch, (Lq, Lk), is accepted only when no per-row convention ran at all: a module that takes
per-row masks but is inert only for a shared one mixes up its rows.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable

import torch

from multihead.checker.loading.calling import CallSpec, LearnerError, invoke
from multihead.checker.bugs.catalogue import FILLS_BLOCKED, NEEDS_MASK, forms_to_try

MASK_FORMS = [*sorted(NEEDS_MASK), "mask-rows-tiled", *FILLS_BLOCKED]  # mistakes under which blocked keys count
from multihead.checker.compare import agree
from multihead.checker.behaviour.layout import nudge
from multihead.checker.bugs.diagnose import closest
from multihead.checker.bugs.sentences import say
from multihead.masks import Mask


@dataclass(frozen=True)
class Encoding:
    """One mask convention: ``encode(keep (B, Lq, Lk), dtype) -> tensor`` and the patterns it can carry."""

    kind: str  # key into text.MASK_TEXT: keep, block, block01, additive, lengths
    shape: str  # shape as the learner passes it, e.g. "(B, 1, Lq, Lk)"
    family: str  # "full", "shared" (same for every batch row), "key" (same for every query), "lengths"
    encode: Callable


def _additive(keep, dtype):
    return torch.zeros(keep.shape, dtype=dtype).masked_fill(~keep, float("-inf"))


def _encodings() -> list[Encoding]:
    """Every convention, most specific shape first."""
    kinds = {
        "keep": lambda m, dt: m,
        "keep01": lambda m, dt: m.to(dt),
        "block01": lambda m, dt: (~m).to(dt),
        "block": lambda m, dt: ~m,
        "additive": _additive,
    }
    shapes = [
        ("(B, 1, Lq, Lk)", "full", lambda m: m[:, None]),
        ("(B, Lq, Lk)", "full", lambda m: m),
        ("(Lq, Lk)", "shared", lambda m: m[0]),
        ("(B, 1, 1, Lk)", "key", lambda m: m[:, :1, None]),
        ("(B, 1, Lk)", "key", lambda m: m[:, :1]),
        ("(B, Lk)", "key", lambda m: m[:, 0]),
    ]
    found = []
    for shape, family, cut in shapes:
        for kind, convert in kinds.items():
            found.append(Encoding(kind.replace("keep01", "keep"), shape, family,
                                  lambda m, dt, cut=cut, convert=convert: convert(cut(m), dt)))
    found.append(Encoding("keep", "(Lq, Lk, B)", "full", lambda m, dt: m.permute(1, 2, 0)))
    # multihead's own modules take a Mask object, which says its convention itself (tried as Mask.keep)
    found.append(Encoding("multihead-mask", "(B, 1, Lq, Lk)", "full", lambda m, dt: Mask.keep(m[:, None])))
    return found


ENCODINGS = _encodings()
MASK_KINDS = {"keep", "block", "block01", "additive", "lengths", "causal-switch", "multihead-mask"}  # Encoding.kind
LENGTHS = [
    Encoding("lengths", "(B,)", "lengths", lambda m, dt: m[:, 0].sum(-1)),
    Encoding("lengths", "(B, Lq)", "lengths", lambda m, dt: m.sum(-1)),
]


def random_pattern(family: str, B: int, Lq: int, Lk: int, gen: torch.Generator) -> torch.Tensor:
    """A random keep pattern (B, Lq, Lk) this family can carry; every query keeps at least one key."""
    if family == "lengths":  # a different length for every batch row (when there are enough keys)
        lens = torch.randperm(Lk, generator=gen)[:B] + 1 if Lk >= B else torch.randint(1, Lk + 1, (B,), generator=gen)
        lens = lens[:, None]
        return (torch.arange(Lk) < lens[..., None]).expand(B, Lq, Lk).clone()
    if family == "causal":  # the causal pattern, for a mask that only switches causal masking on
        return torch.ones(Lq, Lk, dtype=torch.bool).tril().expand(B, Lq, Lk).clone()
    rows = {"full": (B, Lq), "shared": (1, Lq), "key": (B, 1)}[family]
    keep = torch.rand(*rows, Lk, generator=gen) < 0.6
    keep[torch.arange(rows[0])[:, None], torch.arange(rows[1]), torch.randint(Lk, rows, generator=gen)] = True
    return keep.expand(B, Lq, Lk).clone()


def probe_pattern(family: str, B: int, Lq: int, Lk: int) -> torch.Tensor:
    """Key padding (B, Lq, Lk): batch row b keeps keys j < len_b; the same len for "shared"."""
    lens = torch.tensor([Lk - 2, 2, Lk - 1, 1] * B)[:B]
    if family == "shared":
        lens = lens[:1].expand(B)
    return (torch.arange(Lk) < lens[:, None, None]).expand(B, Lq, Lk).clone()


def try_encoding(module, spec: CallSpec, encoding: Encoding, inputs, tol: float, raised: list | None = None) -> str:
    """"inert" when, with this encoding, changing the blocked keys (and values) leaves the outputs alone;
    "moved" when it runs but they change something; "failed" when the call raises or its shape is wrong.

    A causal module never sees later keys, so there the earliest keys are blocked instead (except for
    lengths, which always block the last ones); only queries that still see a key are compared.
    """
    xq, xk, xv = inputs
    B, Lq, Lk = xq.shape[0], xq.shape[1], xk.shape[1]
    keep = probe_pattern(encoding.family, B, Lq, Lk)
    if spec.causal and encoding.family != "lengths":
        keep = keep.flip(-1)  # (B, Lq, Lk): block a prefix of the keys, which causal queries do see
    blocked = ~keep[:, 0, :, None]  # (B, Lk, 1)
    rows = torch.ones(B, Lq, dtype=torch.bool)  # (B, Lq): the queries compared
    if spec.causal:
        rows &= (keep & torch.ones(Lq, Lk, dtype=torch.bool).tril()).any(-1)
    trial = CallSpec(**{**spec.__dict__, "encoding": encoding})
    try:
        before = invoke(module, trial, xq, xk, xv, keep)
        if spec.inputs == "x":
            after = invoke(module, trial, xq + 3.0 * blocked * nudge(xq), keep=keep)
            rows &= keep[:, 0, :Lq]  # blocked positions are queries too: compare the kept ones
        else:
            after = invoke(module, trial, xq, xk + 3.0 * blocked * nudge(xk), xv + 3.0 * blocked * nudge(xv, 1), keep)
    except LearnerError as error:
        if raised is not None:
            raised.append(error)
        return "failed"
    before, after = before[rows], after[rows]
    if not torch.isfinite(before).all():
        return "moved"
    return "inert" if agree(before, after, tol) else "moved"


def blocked_keys_are_inert(module, spec: CallSpec, encoding: Encoding, inputs, tol: float) -> bool:
    return try_encoding(module, spec, encoding, inputs, tol) == "inert"


def detect_encoding(module, spec: CallSpec, inputs, tol: float) -> Encoding | None:
    """The first convention under which blocked keys are inert, trying the parameter name's kind first;
    a shared (Lq, Lk) one only when no per-row convention ran (see the module docstring).

    When the module raises under every convention, its own code fails as soon as it is given a mask (a
    typo such as ``mask_fill``): the exception it raised most often is raised again, to lead the report."""
    order = LENGTHS + ENCODINGS if spec.mask_kind == "lengths" else ENCODINGS + LENGTHS
    per_row_ran, any_ran, shared, raised = False, False, None, []
    for encoding in order:
        outcome = try_encoding(module, spec, encoding, inputs, tol, raised)
        any_ran = any_ran or outcome != "failed"
        if encoding.family == "shared":
            shared = shared or (encoding if outcome == "inert" else None)
            continue
        if outcome == "inert":
            return encoding
        per_row_ran = per_row_ran or outcome == "moved"
    own = [error for error in raised if error.where]  # the learner's own line raised (not a wrong shape)
    if not any_ran and own:
        counts = Counter((type(error.error), error.where) for error in own)
        raise next(error for error in own if (type(error.error), error.where) == counts.most_common(1)[0][0])
    return None if per_row_ran else shared


def causal_switch(module, spec: CallSpec, inputs, tol: float) -> Encoding | None:
    """A mask argument whose presence alone switches causal masking on (Whisper's fused path passes
    ``is_causal=mask is not None``): two different masks give the same outputs, unlike no mask at all.
    Returns an encoding whose masks are then checked with the causal pattern, or None."""
    xq, xk, xv = inputs
    B, Lq, Lk = xq.shape[0], xq.shape[1], xk.shape[1]
    gen = torch.Generator().manual_seed(6)
    first, second = (random_pattern("full", B, Lq, Lk, gen) for _ in range(2))
    for encoding in ENCODINGS:
        trial = CallSpec(**{**spec.__dict__, "encoding": encoding})
        try:
            with torch.no_grad():
                one, other = (invoke(module, trial, xq, xk, xv, keep) for keep in (first, second))
                none = invoke(module, trial, xq, xk, xv)
        except LearnerError:
            continue
        if agree(one, other, tol) and not agree(one, none, tol):
            return Encoding("causal-switch", encoding.shape, "causal", encoding.encode)
        return None
    return None


def all_keep_encoding(module, spec: CallSpec, inputs) -> Encoding | None:
    """For a mask argument the module requires: the first convention whose all-keep mask gives finite
    outputs that differ between queries (an all-blocked mask gives NaN, or the same mean of the values for
    every query), to stand for "no mask" in every unmasked call. None when no convention runs so."""
    xq, xk, xv = inputs
    keep = torch.ones(xq.shape[0], xq.shape[1], xk.shape[1], dtype=torch.bool)
    for encoding in [e for e in ENCODINGS + LENGTHS if e.family != "shared"]:
        trial = CallSpec(**{**spec.__dict__, "encoding": encoding})
        try:
            with torch.no_grad():
                out = invoke(module, trial, xq, xk, xv, keep)
        except LearnerError:
            continue
        if torch.isfinite(out).all() and not torch.allclose(out, out[:, :1].expand_as(out)):
            return encoding
    return None


def tried_text(lang: str = "en") -> str:
    """The conventions tried, for the report of a mask that could not be verified."""
    shapes = ", ".join(dict.fromkeys(e.shape for e in ENCODINGS))
    return say("tried", lang, shapes=shapes, lengths=", ".join(e.shape for e in LENGTHS))


def encoding_by_agreement(module, spec: CallSpec, assignments, plain_cases, make_cases, tol: float):
    """(encoding, ignored): the convention under which the masked outputs match the correct maths or a
    mask-after-softmax variant (whose blocked keys are not inert: they still count in the softmax);
    else, when every convention leaves the outputs unchanged, the first that runs and ignored=True;
    else (None, False)."""
    with torch.no_grad():
        wanted = [invoke(module, spec, *case) for case in plain_cases]
        forms = [None, *forms_to_try(False, spec.causal)]
        roles = closest(module, spec, assignments, plain_cases, wanted, forms).roles
        running, all_ignored = None, True
        for encoding in sorted(ENCODINGS + LENGTHS, key=lambda e: e.family == "shared"):
            if encoding.family == "shared" and running is not None:
                continue  # per-row masks ran: a shared one would hide rows mixed up
            trial = CallSpec(**{**spec.__dict__, "encoding": encoding})
            cases = make_cases(trial)
            try:
                got = [invoke(module, trial, *case) for case in cases]
                unmasked = [invoke(module, trial, *case[:3]) for case in cases]
            except LearnerError:
                continue
            if closest(module, trial, [roles], cases, got, [None, *MASK_FORMS]).error <= tol:
                return encoding, False
            running = running or encoding
            all_ignored = all_ignored and all(agree(g, u, tol) for g, u in zip(got, unmasked))
    if running is not None and all_ignored:
        return running, True
    return None, False
