"""The commands' argument parser in the user's language: --help, usage and usage errors in English or
Chinese, their lines broken by multihead.terminal.line_breaks (a Chinese character is two columns wide, an option
or a topic name is never cut).

Each tool keeps its own help texts in both languages; this module says the words argparse itself prints
("usage:", the section titles, "show this help", the common errors), from the terminal's phrasebook
(multihead/terminal/words/en.json and zh.json, which also hold the `multihead` command's own texts).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from multihead.terminal.language import pick
from multihead.terminal.line_breaks import cells, wrap
from multihead.terminal.phrasebook import Phrasebook

WORDS = Phrasebook(Path(__file__).resolve().parent / "words")


def say(lang: str, section: str, key: str, **values) -> str:
    """The terminal's message `section`/`key` in `lang`, filled."""
    return WORDS.say(lang, section, key, **values)


def error_pattern(english: str) -> re.Pattern:
    """The regular expression of one argparse error, read from its English words: each {n} is a group."""
    return re.compile("(.+?)".join(re.escape(piece) for piece in re.split(r"\{\d+\}", english)))


def help_texts(table: Mapping[str, tuple[str, str]], lang: str) -> Callable[[str], str]:
    """`text(option)`: a tool's help text for `option` in `lang`, from its (English, Chinese) table, with "%"
    escaped for argparse."""
    def text(option: str) -> str:
        return pick(lang, *table[option]).replace("%", "%%")

    return text


def error_text(message: str, lang: str) -> str:
    """argparse's error `message` in `lang`; a message with no translation stays in English."""
    if lang == "en":
        return message
    for key, english in WORDS.words("en")["argparse_errors"].items():   # in file order: most specific first
        found = error_pattern(english).fullmatch(message)
        if found:
            return WORDS.message(lang, "argparse_errors", key).format(*found.groups())
    return message


class _Formatter(argparse.HelpFormatter):
    lang = "en"

    def _split_lines(self, text: str, width: int) -> list[str]:
        return wrap(" ".join(text.split()), width)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n".join(indent + line for line in wrap(" ".join(text.split()), width - len(indent)))

    def _format_usage(self, usage, actions, groups, prefix):
        # argparse indents the usage's later lines by len(prefix): give it a stand-in as wide in columns
        # as the real prefix ("用法：" is 3 characters, 6 columns)
        prefix = say(self.lang, "parser", "usage") if prefix is None else prefix
        stand_in = "\0" * cells(prefix)
        return super()._format_usage(usage, actions, groups, stand_in).replace(stand_in, prefix, 1)

    def format_help(self) -> str:
        text = super().format_help()  # section headings end with argparse's ":"; Chinese takes "："
        return re.sub(r"^([^\n]*[^\x00-\x7f]):$", r"\1：", text, flags=re.M) if self.lang == "zh" else text


class EnglishFormatter(_Formatter):
    """argparse's layout with multihead.terminal.line_breaks' line breaking."""

    lang = "en"


class ChineseFormatter(_Formatter):
    """The same, with argparse's own words in Chinese."""

    lang = "zh"


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that speaks `lang` ("en" or "zh"); its subcommands' parsers speak it too."""

    def __init__(self, *args, lang: str = "en", **kwargs):
        kwargs.setdefault("formatter_class", ChineseFormatter if lang == "zh" else EnglishFormatter)
        super().__init__(*args, add_help=False, **kwargs)
        self.lang = lang
        self._positionals.title = say(lang, "parser", "positional")
        self._optionals.title = say(lang, "parser", "options")
        self.add_argument("-h", "--help", action="help", help=say(lang, "parser", "help"))

    def error(self, message: str):
        """Usage, then the error in the parser's language; exits with status 2."""
        self.print_usage(sys.stderr)
        self.exit(2, say(self.lang, "parser", "error", prog=self.prog, message=error_text(message, self.lang)))
