"""`multihead explain`: the walkthrough (default), one topic (`multihead explain TOPIC`, or --topic
TOPIC), or a real sentence (--text),
in English or Chinese, in the terminal and optionally as an interactive HTML page (--html).

Exit codes: 0 every check passed, 1 some check failed, 2 bad usage or the 'models' extra missing.
"""
from __future__ import annotations

import argparse

from rich import box
from rich.console import Console
from rich.text import Text

from multihead.terminal.help import help_texts
from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.words import ui
from multihead.terminal.language import resolve_lang
from multihead.explain.lesson import lesson, topic_story  # noqa: F401 - topic_story: part of this module's API
from multihead.explain.walkthrough.real_model import ModelsMissing
from multihead.explain.render.page import write_page
from multihead.explain.render.terminal import FittedTable, Wrapped, make_console, render, render_summary
from multihead.explain.story import LANGS
from multihead.explain.topics import TOPICS


def configure(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """Add explain's options to its subcommand parser, their help in `lang`."""
    text = help_texts(words.BOOK.pairs("options"), lang)
    parser.add_argument("--lang", choices=LANGS, default=None, help=text("lang"))
    parser.add_argument("name", nargs="?", metavar="TOPIC", help=text("name"))
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help=text("list"))
    mode.add_argument("--topic", metavar="TOPIC", help=text("topic"))
    mode.add_argument("--text", metavar="SENTENCE", help=text("text"))
    parser.add_argument("--layer", type=int, default=0, metavar="N", help=text("layer"))
    parser.add_argument("--html", metavar="PATH", help=text("html"))


def list_topics(console, lang: str) -> int:
    topics = TOPICS
    if not topics:
        console.print(ui("no_topics", lang))
        return 0
    rows = [[name, topic.document, topic.question[lang]] for name, topic in topics.items()]
    console.print(FittedTable([ui("topic_col", lang), ui("doc_col", lang), ui("question_col", lang)], rows,
                              ui("topics_title", lang), box.SIMPLE_HEAD, first_style="cyan"))
    console.print(documents_table(lang))
    return 0


def documents_table(lang: str) -> FittedTable:
    """The five source documents the topics' questions come from: number, title, public source."""
    rows = [[number, words.common(lang, "document_line", **document)]
            for number, document in words.words(lang)["documents"].items()]
    return FittedTable([ui("doc_col", lang), ui("document_col", lang)], rows, ui("documents_title", lang),
                       box.SIMPLE_HEAD)


def chosen_topic(args: argparse.Namespace, lang: str = "en") -> str | None:
    """The topic asked for, positionally (`explain TOPIC`) or with --topic; AttentionError, said in `lang`,
    when the positional name comes together with --topic, --text or --list."""
    name = getattr(args, "name", None)
    if name is None:
        return args.topic
    for option, value in (("--topic", args.topic), ("--text", args.text), ("--list", getattr(args, "list", False))):
        if value:
            raise AttentionError(ui("topic_once", lang, name=name, option=option))
    return name


def _error(message: str) -> int:
    """Print `message` on stderr, wrapped like every other text (no command or topic name cut); returns 2."""
    Console(stderr=True, highlight=False).print(Wrapped(Text(f"multihead explain: {message}")))
    return 2


def main(args: argparse.Namespace) -> int:
    """Run `multihead explain` with parsed arguments; returns the exit code."""
    console = make_console()
    page = getattr(args, "html", None)
    try:
        lang = resolve_lang(getattr(args, "lang", None))
        topic = chosen_topic(args, lang)
        if getattr(args, "list", False):
            return list_topics(console, lang)
        told = lesson(topic=topic, text=args.text, layer=args.layer, lang=lang, page=bool(page))
    except (AttentionError, ModelsMissing) as exc:
        return _error(str(exc))
    render(told.story, console)
    render_summary([told.story], console, lang)
    if page:
        try:
            path, size = write_page(page, told)
        except OSError as exc:
            return _error(ui("cannot_write", lang, path=page, reason=exc))
        except AttentionError as exc:
            return _error(str(exc))
        console.print(Wrapped(Text(ui("wrote_html", lang, path=str(path), size=size / 2**20))))
    return 0 if told.checks_passed else 1
