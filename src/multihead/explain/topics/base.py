"""What a topic is, and the few helpers every topic file shares.

A topic answers one question from the seed documents. Its `run(story)` computes the answer on
live tensors and records every claim with `story.check`, so the answer cannot drift into a lie.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from multihead.explain.story import Story
from multihead.explain.walk_checks import diff_text, max_diff  # noqa: F401 - the topics' too


@dataclass(frozen=True)
class Topic:
    """One `multihead explain --topic NAME`: a seed document's question and its live answer."""

    name: str                       # kebab-case CLI name
    title: dict[str, str]           # {"en": ..., "zh": ...}
    document: str                   # seed document number, e.g. "000"
    question: dict[str, str]        # the document's question, paraphrased, {"en": ..., "zh": ...}
    run: Callable[[Story], None]    # fills the story; one story.check per claim


def topic(name: str, document: str, title: tuple[str, str], question: tuple[str, str]):
    """Decorator: turn `def run(story)` into a Topic. title and question are (en, zh) pairs."""

    def wrap(fill: Callable[[Story], None]) -> Topic:
        @functools.wraps(fill)
        def run(story: Story) -> None:
            with torch.random.fork_rng(devices=[]):   # topics seed freely without touching the caller's RNG
                fill(story)

        return Topic(name=name, title={"en": title[0], "zh": title[1]}, document=document,
                     question={"en": question[0], "zh": question[1]}, run=run)

    return wrap


def pick(story: Story, en: str, zh: str) -> str:
    """The story's language version of a text (labels, table columns, code): `story.pick`."""
    return story.pick(en, zh)


def error_of(fn: Callable[[], object]) -> BaseException | None:
    """Run fn and return the exception it raised, or None if it ran through."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - we show whatever the real library raises
        return exc
    return None


def error_text(exc: BaseException | None) -> str:
    """`RuntimeError: message` (first line), the form the topics print; `AssertionError()` when the
    exception says nothing."""
    if exc is None:
        return "(no error)"
    if not str(exc):
        return f"{type(exc).__name__}()"
    return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"


def stride_text(story: Story, t: torch.Tensor, then: torch.Tensor | None = None) -> str:
    """`stride (12, 4, 1)`, or `stride (3, 1) -> (1, 3)` from t to `then`, in the story's language."""
    text = f"{story.pick('stride', '步幅')} {t.stride()}"
    return text if then is None else f"{text} -> {then.stride()}"


def memory_order(t: torch.Tensor) -> torch.Tensor:
    """The numbers of t's storage as they lie in memory, 1-D (what reshape/view read from)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
