"""`multihead explain`: the walkthrough (default), one topic (`multihead explain TOPIC`, or --topic
TOPIC), or a real sentence (--text),
in English or Chinese, in the terminal and optionally as an interactive HTML page (--html).

Exit codes: 0 every check passed, 1 some check failed, 2 bad usage or the 'models' extra missing.
"""
from __future__ import annotations

import argparse

from rich.console import Console

from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.lang import resolve_lang, ui
from multihead.explain.lesson import lesson, topic_story  # noqa: F401 - topic_story: part of this module's API
from multihead.explain.model_text import ModelsMissing
from multihead.explain.page import write_page
from multihead.explain.render_terminal import cell, make_console, render, render_summary
from multihead.explain.story import LANGS
from multihead.explain.topics import TOPICS


def configure(parser: argparse.ArgumentParser) -> None:
    """Add explain's options to its subcommand parser."""
    parser.add_argument("--lang", choices=LANGS, default=None,
                        help="language of the explanation (default: from LC_ALL/LC_MESSAGES/LANG, else en)")
    parser.add_argument("name", nargs="?", metavar="TOPIC",
                        help="explain one topic (see --list); the same as --topic TOPIC")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--list", action="store_true", help="list the topics and exit")
    mode.add_argument("--topic", metavar="TOPIC", help="explain one topic (see --list)")
    mode.add_argument("--text", metavar="SENTENCE",
                      help="walk through one layer of the pretrained all-MiniLM-L6-v2 on this sentence "
                           "(needs the 'models' extra)")
    parser.add_argument("--layer", type=int, default=0, metavar="N",
                        help="with --text: which of the model's layers (0-5, default 0)")
    parser.add_argument("--html", metavar="PATH",
                        help="also write an interactive, self-contained HTML page to PATH (offline, EN/ZH)")


def list_topics(console, lang: str) -> int:
    from rich import box
    from rich.table import Table

    topics = TOPICS
    if not topics:
        console.print(ui("no_topics", lang))
        return 0
    table = Table(title=ui("topics_title", lang), box=box.SIMPLE_HEAD, title_style="bold")
    table.add_column(ui("topic_col", lang), style="cyan", no_wrap=True)
    table.add_column(ui("doc_col", lang), justify="center")
    table.add_column(ui("question_col", lang))
    for name, topic in topics.items():
        table.add_row(cell(name), cell(topic.document), cell(topic.question[lang]))
    console.print(table)
    console.print(documents_table(lang))
    return 0


def documents_table(lang: str):
    """The five source documents the topics' questions come from: number, title, public source."""
    from rich import box
    from rich.table import Table

    table = Table(title=ui("documents_title", lang), box=box.SIMPLE_HEAD, title_style="bold")
    table.add_column(ui("doc_col", lang), no_wrap=True)
    table.add_column(ui("document_col", lang))
    for number, document in words.words(lang)["documents"].items():
        table.add_row(cell(number), cell(words.common(lang, "document_line", **document)))
    return table


def chosen_topic(args: argparse.Namespace) -> str | None:
    """The topic asked for, positionally (`explain TOPIC`) or with --topic; AttentionError when the
    positional name comes together with --topic, --text or --list."""
    name = getattr(args, "name", None)
    if name is None:
        return args.topic
    for option, value in (("--topic", args.topic), ("--text", args.text), ("--list", getattr(args, "list", False))):
        if value:
            raise AttentionError(f"give the topic once: either `multihead explain {name}` or {option}; "
                                 f"got both.")
    return name


def main(args: argparse.Namespace) -> int:
    """Run `multihead explain` with parsed arguments; returns the exit code."""
    console = make_console()
    page = getattr(args, "html", None)
    try:
        lang = resolve_lang(getattr(args, "lang", None))
        topic = chosen_topic(args)
        if getattr(args, "list", False):
            return list_topics(console, lang)
        told = lesson(topic=topic, text=args.text, layer=args.layer, lang=lang, page=bool(page))
    except (AttentionError, ModelsMissing) as exc:
        Console(stderr=True).print(f"multihead explain: {exc}", markup=False, highlight=False)
        return 2
    render(told.story, console)
    render_summary([told.story], console, lang)
    if page:
        try:
            path, size = write_page(page, told)
        except OSError as exc:
            Console(stderr=True).print(f"multihead explain: cannot write {page}: {exc}", markup=False)
            return 2
        except AttentionError as exc:
            Console(stderr=True).print(f"multihead explain: {exc}", markup=False, highlight=False)
            return 2
        console.print(ui("wrote_html", lang, path=str(path), size=size / 2**20), markup=False)
    return 0 if told.checks_passed else 1
