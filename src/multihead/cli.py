"""The `multihead` command: one argparse subcommand per tool.

Each tool lives in its own subpackage and exposes two functions:
``configure(parser)`` adds its arguments, ``main(args) -> int`` runs it and returns the exit code.
Only the chosen tool's module is imported, so `multihead check` never pays for matplotlib.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from multihead import __version__

SUBCOMMANDS = {
    "explain": ("multihead.explain.cli", "walk through multi-head attention step by step (EN/ZH)"),
    "check": ("multihead.checker.cli", "check your own attention module against the reference"),
    "bench": ("multihead.bench.cli", "benchmark multihead against its peers on this machine"),
}


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """The parser; only the `chosen` subcommand's module is imported to add its arguments."""
    parser = argparse.ArgumentParser(prog="multihead", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"multihead {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_path, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text, description=help_text)
        sub_parser.set_defaults(_module=module_path)
        if name == chosen:
            tool(module_path).configure(sub_parser)
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
    args = build_parser(chosen).parse_args(argv)
    return int(tool(args._module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
