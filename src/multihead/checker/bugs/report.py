"""The checker's answer: a ``CheckReport``, readable as text in English or Chinese.

verdict "pass" (exit code 0), "fail" (1: a named bug, an exception, or an unknown difference with its
measured error) or "error" (2: the file, class or constructor could not be used).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from multihead.checker.bugs.catalogue import BUG_BY_ID
from multihead.checker.bugs.role_words import role_text
from multihead.checker.bugs.sentences import bug_name, say
from multihead.checker.core.judge import stage_lines

EXIT_CODES = {"pass": 0, "fail": 1, "error": 2}
# mask convention (masks.Encoding.kind) -> the sentence a PASS says about it (text.MEANING_TEXT "meaning:...")
MEANING_KINDS = {"keep": "keep", "block": "block", "block01": "block", "additive": "additive", "lengths": "lengths"}


@dataclass
class CheckReport:
    """What ``multihead check`` found. ``str(report)`` is the plain-text report."""

    target: str
    lang: str = "en"
    verdict: str = "error"  # "pass", "fail" or "error"
    reason: str = ""  # why the check could not run (verdict "error")
    bug: str | None = None  # catalogue id
    bug_values: dict = field(default_factory=dict)  # fills the bug text (e.g. the misspelled name)
    error: float | None = None  # max relative forward error against the reference
    grad_error: float | None = None  # max relative gradient error (when the outputs matched)
    exception: str | None = None  # what the learner's code raised ("AttributeError: ...")
    where: str = ""  # the learner's line that raised it ("file.py:24: scores = ..."), when known
    conventions: list[tuple[str, dict]] = field(default_factory=list)  # (text key, values)
    roles: dict[str, str] = field(default_factory=dict)  # role -> where it lives
    notes: list[str] = field(default_factory=list)
    ambiguous: list[str] = field(default_factory=list, repr=False)  # scale ids one head count cannot tell apart
    stage: object = field(default=None, repr=False)  # core.stages.StageFinding: the first stage that differs
    kind: str = "attention"  # "core": passed on its core judged on its own tensors (core/judge.py); "latent": judged as multi-head latent attention (targets/latent.py); "latent-naive": the
    # same, for a module without an absorbed path (its forward alone); "sparse" / "topk": a sparse-attention or
    # top-k selection function (sparse.py)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    @property
    def topic(self) -> str | None:
        """The ``multihead explain`` topic that teaches the bug."""
        return BUG_BY_ID[self.bug].topic if self.bug else None

    def explanation(self) -> str | None:
        """The bug's one-line explanation in the report's language."""
        return say(self.bug_values.get("text", self.bug), self.lang, **self.bug_values) if self.bug else None

    def headline(self) -> str:
        """One line: PASS / FAIL / ERROR and why."""
        lang, target = self.lang, self.target
        if self.verdict == "error":
            return say("error", lang, target=target, reason=self.reason)
        if self.verdict == "pass":
            key = {"core": "pass-core", "latent": "pass-latent", "latent-naive": "pass-latent-naive", "sparse": "pass-sparse",
                   "topk": "pass-topk"}.get(self.kind, "pass")
            return say(key, lang, target=target, error=max(self.error or 0.0, self.grad_error or 0.0))
        if self.bug:
            return say("fail-bug", lang, target=target, bug=bug_name(self.bug, lang))
        if self.exception and self.exception.startswith("WrongOutputShape: "):
            return say("fail-shape", lang, target=target, shape=self.exception.split(": ", 1)[1])
        if self.exception:
            return say("fail-raises", lang, target=target, exception=self.exception)
        if self.reason:
            return say("fail-reason", lang, target=target, reason=self.reason)
        if self.grad_error is not None and (self.error or 0.0) <= self.grad_error:
            return say("fail-grad", lang, target=target, error=self.grad_error)
        return say("fail-unknown", lang, target=target, error=self.error or float("nan"))

    def convention_lines(self) -> list[str]:
        return [say(key, self.lang, **values) for key, values in self.conventions]

    def role_lines(self) -> list[str]:
        colon = "：" if self.lang == "zh" else ": "
        return [f"{say(role, self.lang)}{colon}{role_text(where, self.lang) if where != '(none)' else say('no-out', self.lang)}"
                for role, where in self.roles.items()]

    def mask_lines(self) -> list[str]:
        """For a PASS whose module takes a mask: what the mask means to a caller (the first thing to get right)."""
        if not self.passed:
            return []
        keys = dict(self.conventions)
        kind = next((key for key in MEANING_KINDS if key in keys), None)
        if kind is None:
            return []
        values = keys[kind]
        line = say("meaning:claimed" if "claim" in values else "meaning:" + MEANING_KINDS[kind], self.lang, **values)
        if "mask-complete" in keys:
            line += (" " if self.lang == "en" else "") + say("meaning:complete", self.lang)
        return [line]

    def detail_lines(self) -> list[str]:
        """The mask's meaning (a PASS), the explanation, the explain topic, the exception and notes, as lines."""
        lines = self.mask_lines()
        if self.bug:
            lines.append(self.explanation())
            lines.append(say("explain", self.lang, topic=self.topic))
        if self.stage is not None:
            lines += stage_lines(self.stage, self.lang)
            if self.stage.topic and not self.bug:
                lines.append(say("explain", self.lang, topic=self.stage.topic))
        if self.exception and self.bug:
            lines.append(self.exception)
        if self.exception and self.where:
            lines.append(say("raised-at", self.lang, where=self.where))
        return lines + list(self.notes)

    def to_dict(self) -> dict:
        """Plain data (for JSON or notebooks)."""
        return {"target": self.target, "verdict": self.verdict, "exit_code": self.exit_code,
                "bug": self.bug, "topic": self.topic, "explanation": self.explanation(),
                "error": self.error, "grad_error": self.grad_error, "exception": self.exception,
                "where": self.where or None,
                "reason": self.reason or None, "conventions": self.convention_lines(),
                "roles": dict(self.roles), "notes": list(self.notes),
                "stage": getattr(self.stage, "stage", None) if self.stage is not None else None}

    def _repr_pretty_(self, printer, cycle) -> None:  # IPython / Jupyter show the text report
        printer.text(str(self))

    def __str__(self) -> str:
        lines = [self.headline()]
        if self.verdict != "error":
            lines += [f"  {line}" for line in self.detail_lines()]
            colon = "：" if self.lang == "zh" else ":"
            if self.conventions:
                lines += [say("conventions", self.lang) + colon] + [f"  - {c}" for c in self.convention_lines()]
            if self.roles:
                lines += [say("roles", self.lang) + colon] + [f"  - {r}" for r in self.role_lines()]
        return "\n".join(lines)
