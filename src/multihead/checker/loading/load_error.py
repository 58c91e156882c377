"""``LoadError``: the learner's file, class, function or constructor could not be used (exit code 2)."""

from __future__ import annotations


class LoadError(Exception):
    """The learner's file, class or constructor could not be used (the checker exits with 2).

    ``str(error)`` is the English message; ``error.text(lang)`` the message in ``lang``.
    """

    def __init__(self, english: str, chinese: str | None = None):
        super().__init__(english)
        self.chinese = chinese or english

    def text(self, lang: str) -> str:
        return self.chinese if lang == "zh" else str(self)
