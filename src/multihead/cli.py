"""The `multihead` command: one argparse subcommand per tool.

Each tool lives in its own subpackage and exposes two functions: ``configure(parser, lang)`` adds its
arguments (their help in `lang`, "en" or "zh"), ``main(args) -> int`` runs it and returns the exit code.
Only the chosen tool's module is imported, so `multihead check` never pays for matplotlib. The help
speaks the language of --lang, else of the locale (multihead.terminal.language), for every subcommand.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from multihead import __version__
from multihead.terminal.help import Parser, say
from multihead.terminal.language import lang_in_argv, resolve_lang

SUBCOMMANDS = {  # name -> the tool's command module; its one-line help is the terminal words' command/NAME
    "explain": "multihead.explain.cli",
    "check": "multihead.checker.cli",
    "bench": "multihead.bench.cli",
}


def build_parser(chosen: str | None = None, lang: str = "en") -> argparse.ArgumentParser:
    """The parser, speaking `lang` ("en" or "zh"); only the `chosen` subcommand's module is imported to add
    its arguments."""
    parser = Parser(prog="multihead", description=say(lang, "command", "description"), lang=lang)
    parser.add_argument("--version", action="version", version=f"multihead {__version__}",
                        help=say(lang, "command", "version"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title=say(lang, "command", "commands"))
    sub.required = True
    for name, module_path in SUBCOMMANDS.items():
        help_text = say(lang, "command", name)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text, lang=lang)
        sub_parser.set_defaults(_module=module_path)
        if name == chosen:
            tool(module_path, lang).configure(sub_parser, lang)
    return parser


class MissingExtra(SystemExit):
    """A tool's third-party package (rich, matplotlib) is not installed: say which extra brings it."""


def tool(module_path: str, lang: str = "en"):
    """The tool's command module; a clear exit, in `lang`, when its 'cli' extra is missing."""
    try:
        return importlib.import_module(module_path)
    except ImportError as exc:
        if (exc.name or "").startswith("multihead"):
            raise
        print(say(lang, "command", "missing_extra", reason=exc), file=sys.stderr)
        raise MissingExtra(2) from exc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    lang = resolve_lang(lang_in_argv(argv))
    args = build_parser(chosen, lang).parse_args(argv)
    return int(tool(args._module, lang).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
