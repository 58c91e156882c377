"""Everything `multihead explain` says, kept apart from the code that computes it.

One file per language, `en.json` and `zh.json`, holds every sentence keyed by section and message id:

    {"documents": {"000": {"short": ..., "title": ..., "source": ...}, ...},   the five source documents
     "common":    {"stride": "stride", ...},                                    labels topics share
     "page":      {"model_view": "Model view", ...},                            the HTML page's own labels
     "topics":    {"memory-order": {"title": ..., "question": ..., "check.x": ..., ...}, ...}}

A message is a `str.format` template ({name} placeholders, {name:.2f} for numbers), or a list of
lines (code blocks) joined with newlines. Both files have the same keys, in the same order, with the
same placeholders (tests/test_explain_words.py). The order of "topics" is the order in which
`--list`, the closing table and docs/explain.md show them. A translator edits only these files.
"""
from __future__ import annotations

import functools
import json
import string
from pathlib import Path
from typing import Any

from multihead.errors import AttentionError

HERE = Path(__file__).resolve().parent
LANGS = ("en", "zh")


@functools.cache
def words(lang: str) -> dict[str, Any]:
    """The whole words file of `lang` ("en" or "zh"), parsed once."""
    if lang not in LANGS:
        raise AttentionError(f"lang must be one of {LANGS}; got {lang!r}.")
    return json.loads((HERE / f"{lang}.json").read_text(encoding="utf-8"))


def template(message: str | list[str]) -> str:
    """A message as one template: a list of lines is joined with newlines."""
    return "\n".join(message) if isinstance(message, list) else message


def fill(message: str | list[str], values: dict[str, Any]) -> str:
    """The message with its {placeholders} filled from `values`."""
    return template(message).format(**values)


def placeholders(message: str | list[str]) -> list[str]:
    """The placeholder names of a message, in order of appearance ("{n:.2f}" gives "n")."""
    return [name for _, name, _, _ in string.Formatter().parse(template(message)) if name is not None]


def topic_words(lang: str, name: str) -> dict[str, Any]:
    """The messages of topic `name` in `lang` (title, question, and its own ids)."""
    return words(lang)["topics"][name]


def common(lang: str, key: str, **values: Any) -> str:
    """A label shared by topics ("stride", "shape", ...), filled."""
    return fill(words(lang)["common"][key], values)


def page_words(lang: str) -> dict[str, str]:
    """The HTML page's own labels in `lang`, as plain strings."""
    return {key: template(value) for key, value in words(lang)["page"].items()}


def document(lang: str, number: str) -> dict[str, str]:
    """One source document's short name, title and public source, in `lang`."""
    return words(lang)["documents"][number]
