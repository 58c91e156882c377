"""Bilingual text as data: one JSON file per language in a folder, the one way the tools keep what they say.

A phrasebook is a folder holding `en.json` and `zh.json`, nested sections of messages keyed by id:

    {"parser": {"usage": "usage: ", ...}, "commands": {"explain": "walk through ...", ...}}

A message is a `str.format` template ({name} placeholders, {name:.2f} for numbers), or a list of lines
(code blocks, several words for one thing) joined with newlines. Both files hold the same ids in the same
order with the same placeholders: `Phrasebook.out_of_step()` lists every difference, and each phrasebook's
test asserts it finds none. A translator edits only the JSON files; code names a message by its path.

    BOOK = Phrasebook(Path(__file__).parent / "words")
    BOOK.say("zh", "parser", "usage")          -> "用法："
    BOOK.pairs("options")                       -> {"lang": ("language of ...", "讲解用的语言 ..."), ...}

Code that still keeps {id: (English, Chinese)} tables in Python moves them here with `write_phrasebook`
(once, by hand), then reads them back through a Phrasebook.
"""
from __future__ import annotations

import collections
import json
import string
from pathlib import Path
from typing import Any

from multihead.errors import AttentionError
from multihead.terminal.language import LANGS

Message = str | list[str]


def template(message: Message) -> str:
    """A message as one template: a list of lines is joined with newlines."""
    return "\n".join(message) if isinstance(message, list) else message


def fill(message: Message, values: dict[str, Any]) -> str:
    """The message with its {placeholders} filled from `values`."""
    return template(message).format(**values)


def placeholders(message: Message) -> list[str]:
    """The placeholder names of a message, in order of appearance ("{n:.2f}" gives "n")."""
    return [name for _, name, _, _ in string.Formatter().parse(template(message)) if name is not None]


def flatten(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], Message]:
    """{(section, ..., id): message} for every message of a words tree, in file order."""
    found: dict[tuple[str, ...], Message] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            found.update(flatten(value, (*prefix, key)))
        else:
            found[(*prefix, key)] = value
    return found


class Phrasebook:
    """The messages of one folder's `en.json` and `zh.json`, each file parsed once, on first use."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        self._loaded: dict[str, dict[str, Any]] = {}

    def words(self, lang: str) -> dict[str, Any]:
        """The whole words tree of `lang` ("en" or "zh")."""
        if lang not in LANGS:
            raise AttentionError(f"lang must be one of {LANGS}; got {lang!r}.")
        if lang not in self._loaded:
            self._loaded[lang] = json.loads((self.folder / f"{lang}.json").read_text(encoding="utf-8"))
        return self._loaded[lang]

    def message(self, lang: str, *path: str) -> Message:
        """The message at `path` (section, ..., id) in `lang`, unfilled."""
        found: Any = self.words(lang)
        for key in path:
            found = found[key]
        return found

    def say(self, lang: str, *path: str, **values: Any) -> str:
        """The message at `path` in `lang`, its {placeholders} filled from `values`."""
        return fill(self.message(lang, *path), values)

    def pairs(self, *section: str) -> dict[str, tuple[str, str]]:
        """{id: (English, Chinese)} for the messages of one section: the form of the tables that
        multihead.terminal.help.help_texts reads."""
        en, zh = (self.message(lang, *section) for lang in LANGS)
        return {key: (template(en[key]), template(zh[key])) for key in en}

    def out_of_step(self) -> list[str]:
        """Every way the two languages differ: ids missing or out of order, empty messages, a list against a
        string, other placeholders. Empty when they are in step."""
        en, zh = (flatten(self.words(lang)) for lang in LANGS)
        if list(en) != list(zh):
            only = [f"{'/'.join(k)}: only in {'en' if k in en else 'zh'}" for k in (en.keys() ^ zh.keys())]
            return only or ["the same ids, in another order"]
        bad = []
        for key, message in en.items():
            name, other = "/".join(key), zh[key]
            if not message or not other:
                bad.append(f"{name}: {'English' if not message else 'Chinese'} is empty")
            elif type(message) is not type(other):
                bad.append(f"{name}: English is a {type(message).__name__}, Chinese a {type(other).__name__}")
            elif collections.Counter(placeholders(message)) != collections.Counter(placeholders(other)):
                bad.append(f"{name}: placeholders differ: English {placeholders(message)}, "
                           f"Chinese {placeholders(other)}")
        return bad


def write_phrasebook(folder: Path, sections: dict[str, dict[str, tuple[str, str]]]) -> Phrasebook:
    """Write {section: {id: (English, Chinese)}} tables as `folder`/en.json and zh.json (2-space JSON, the
    characters as they are) and return the Phrasebook that reads them: how a table of pairs in code moves
    into the one mechanism."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for index, lang in enumerate(LANGS):
        tree = {name: {key: pair[index] for key, pair in table.items()} for name, table in sections.items()}
        (folder / f"{lang}.json").write_text(json.dumps(tree, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    return Phrasebook(folder)
