"""Reason: why a backend does not take a call, as a constant code; only `mh.dispatch` words it.

The hot path returns these constants and formats nothing. `words` is either fixed text or a function
of the problem that `mh.dispatch` calls to put the numbers in (the skipped fraction, the lengths).

    cannot=True   the backend cannot compute this call exactly (asking for it by name is an error)
    cannot=False  it could, but "auto" prefers another backend for this call
    any_length    the answer holds at every key length (it reads the mask's form, not Lk): a plan chosen after
                  it serves a KV cache's next steps without asking again
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, eq=False)
class Reason:
    """One stable reason code (e.g. "banded.too-few-keys"), whether it is a refusal, and its words."""

    code: str
    cannot: bool
    words: str | Callable[[Any], str]
    any_length: bool = False

    def text(self, problem) -> str:
        """The reason in words for `problem` (off the hot path: mh.dispatch calls it)."""
        return self.words if isinstance(self.words, str) else self.words(problem)

    def __repr__(self) -> str:
        return f"Reason({self.code!r})"


def cannot(code: str, words: str | Callable[[Any], str], any_length: bool = False) -> Reason:
    """A refusal: the backend cannot compute the call exactly."""
    return Reason(code, True, words, any_length)


def declines(code: str, words: str | Callable[[Any], str]) -> Reason:
    """A preference: the backend could run the call, but "auto" should pick another one."""
    return Reason(code, False, words)
