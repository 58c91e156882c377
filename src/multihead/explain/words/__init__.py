"""Everything `multihead explain` says, kept apart from the code that computes it: a phrasebook
(multihead.terminal.phrasebook), one file per language, `en.json` and `zh.json`, keyed by section and id:

    {"documents": {"000": {"short": ..., "title": ..., "source": ...}, ...},   the five source documents
     "common":    {"stride": "stride", ...},                                    labels topics share
     "page":      {"model_view": "Model view", ...},                            the HTML page's own labels
     "ui":        {"summary_ok": "All {n} checks passed.", ...},                the renderers' and the command's words
     "options":   {"lang": "language of the explanation ...", ...},             `multihead explain --help`
     "aliases":   {"masked-fill": ["masks", ...], ...},                         other words that find a topic
     "topics":    {"memory-order": {"title": ..., "question": ..., "check.x": ..., ...}, ...}}

A message is a `str.format` template ({name} placeholders, {name:.2f} for numbers), or a list of
lines (code blocks) joined with newlines. Both files have the same keys, in the same order, with the
same placeholders (tests/test_explain_words.py). The order of "topics" is the order in which
`--list`, the closing table and docs/explain.md show them. A translator edits only these files.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from multihead.terminal.language import LANGS
from multihead.terminal.phrasebook import Phrasebook, fill, placeholders, template  # noqa: F401 - explain's too

BOOK = Phrasebook(Path(__file__).resolve().parent)


def words(lang: str) -> dict[str, Any]:
    """The whole words file of `lang` ("en" or "zh"), parsed once."""
    return BOOK.words(lang)


def topic_words(lang: str, name: str) -> dict[str, Any]:
    """The messages of topic `name` in `lang` (title, question, and its own ids)."""
    return words(lang)["topics"][name]


def common(lang: str, key: str, **values: Any) -> str:
    """A label shared by topics ("stride", "shape", ...), filled."""
    return BOOK.say(lang, "common", key, **values)


def ui(key: str, lang: str, **values: Any) -> str:
    """A label the renderers or the command print themselves (check marks, summaries, errors), filled."""
    return BOOK.say(lang, "ui", key, **values)


def page_words(lang: str) -> dict[str, str]:
    """The HTML page's own labels in `lang`, as plain strings."""
    return {key: template(value) for key, value in words(lang)["page"].items()}


def document(lang: str, number: str) -> dict[str, str]:
    """One source document's short name, title and public source, in `lang`."""
    return words(lang)["documents"][number]
