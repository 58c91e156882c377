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
from multihead.terminal.help import Parser
from multihead.terminal.language import lang_in_argv, pick, resolve_lang

SUBCOMMANDS = {
    "explain": ("multihead.explain.cli", "walk through multi-head attention step by step (EN/ZH)",
                "一步一步讲解多头注意力（中英双语）"),
    "check": ("multihead.checker.cli", "check your own attention module against the reference",
              "拿参考实现检查你自己写的注意力模块"),
    "bench": ("multihead.bench.cli", "benchmark multihead against its peers on this machine",
              "在本机上测试 multihead 和同类实现的速度"),
}
DESCRIPTION = ("multi-head attention for PyTorch: explain it, check yours, benchmark it",
               "PyTorch 多头注意力：讲解它，检查你写的实现，测它的速度")


def build_parser(chosen: str | None = None, lang: str = "en") -> argparse.ArgumentParser:
    """The parser, speaking `lang` ("en" or "zh"); only the `chosen` subcommand's module is imported to add
    its arguments."""
    parser = Parser(prog="multihead", description=pick(lang, *DESCRIPTION), lang=lang)
    parser.add_argument("--version", action="version", version=f"multihead {__version__}",
                        help=pick(lang, "show the version and exit", "显示版本号并退出"))
    sub = parser.add_subparsers(dest="command", metavar="COMMAND",
                                title=pick(lang, "commands", "命令"))
    sub.required = True
    for name, (module_path, en, zh) in SUBCOMMANDS.items():
        help_text = pick(lang, en, zh)
        sub_parser = sub.add_parser(name, help=help_text, description=help_text, lang=lang)
        sub_parser.set_defaults(_module=module_path)
        if name == chosen:
            tool(module_path).configure(sub_parser, lang)
    return parser


class MissingExtra(SystemExit):
    """A tool's third-party package (rich, matplotlib) is not installed: say which extra brings it."""


def tool(module_path: str):
    """The tool's command module; a clear exit when its 'cli' extra is missing."""
    try:
        return importlib.import_module(module_path)
    except ImportError as exc:
        if (exc.name or "").startswith("multihead"):
            raise
        print(f"multihead: this command needs the 'cli' extra ({exc}); from the repository root: "
              'pip install -e ".[cli]"', file=sys.stderr)
        raise MissingExtra(2) from exc


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    args = build_parser(chosen, resolve_lang(lang_in_argv(argv))).parse_args(argv)
    return int(tool(args._module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
