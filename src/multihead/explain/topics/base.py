"""What a topic is, and the few helpers every topic file shares.

A topic answers one question. It is one unit: a `run(story, say)` function that computes the answer
on live tensors and records every claim with `say.check`, so the answer cannot drift into a lie;
and its words, which live in the words files (multihead/explain/words/en.json and zh.json) under
the topic's name. The code names each sentence by its message id (`say.text("why")`); it never
holds English or Chinese, and the words files never hold code.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from multihead.explain import say as said
from multihead.explain import words
from multihead.explain.story import Story
from multihead.explain.walkthrough.checks import diff_text, max_diff  # noqa: F401 - the topics' too

NO_DOCUMENT = "—"  # the document of a topic that answers the project's own question


@dataclass(frozen=True)
class Topic:
    """One `multihead explain --topic NAME`: a question and its live answer."""

    name: str                       # kebab-case CLI name
    title: dict[str, str]           # {"en": ..., "zh": ...}, from the words files
    document: str                   # source document number, e.g. "000", or NO_DOCUMENT
    question: dict[str, str]        # the question, in the project's own words, {"en": ..., "zh": ...}
    run: Callable[[Story], None]    # fills the story; one check per claim


class Say(said.Say):
    """A topic's words in its story's language: its own messages (else a shared "common" label); see
    multihead.explain.say.Say."""

    def __init__(self, story: Story, topic: str):
        super().__init__(story, words.topic_words(story.lang, topic))


def topic(name: str, document: str = NO_DOCUMENT):
    """Decorator: turn `def run(story, say)` into a Topic named `name`; title and question come from
    the words files."""

    def wrap(fill: Callable[[Story, Say], None]) -> Topic:
        @functools.wraps(fill)
        def run(story: Story) -> None:
            with torch.random.fork_rng(devices=[]):   # topics seed freely without touching the caller's RNG
                fill(story, Say(story, name))

        told = {lang: words.topic_words(lang, name) for lang in words.LANGS}
        return Topic(name=name, title={lang: w["title"] for lang, w in told.items()}, document=document,
                     question={lang: w["question"] for lang, w in told.items()}, run=run)

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
    text = f"{words.common(story.lang, 'stride')} {t.stride()}"
    return text if then is None else f"{text} -> {then.stride()}"


def memory_order(t: torch.Tensor) -> torch.Tensor:
    """The numbers of t's storage as they lie in memory, 1-D (what reshape/view read from)."""
    n = t.untyped_storage().nbytes() // t.element_size()
    return torch.empty(0, dtype=t.dtype).set_(t.untyped_storage(), 0, (n,), (1,))
