"""`multihead check FILE.py:Class [--init JSON] [--config JSON] [--call HINTS] [--lang en|zh]`, shown with rich.

Exit code 0: matches the reference; 1: differs (the bug is named when it is a known one); 2: the
file, class or constructor could not be used.
"""

from __future__ import annotations

import argparse

from rich.cells import cell_len
from rich.console import Console
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from multihead.checker.report import CheckReport
from multihead.checker.run import check
from multihead.checker.text import LANGS, bug_name, say
from multihead.checker.wrap import wrap
from multihead.explain.lang import resolve_lang

STYLE = {"pass": "bold green", "fail": "bold red", "error": "bold yellow"}
TITLE = {"pass": ("PASS", "通过"), "fail": ("FAIL", "未通过"), "error": ("ERROR", "错误")}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the check subcommand's arguments."""
    parser.add_argument("target", metavar="FILE.py:Class",
                        help="your module's file and class name, e.g. my_attention.py:MultiHeadAttention, or an "
                             "attention function's, e.g. my_attention.py:scaled_dot_product")
    parser.add_argument("--init", metavar="JSON", default=None,
                        help="constructor keyword arguments as JSON, e.g. "
                             "'{\"d_model\": 16, \"num_heads\": 4}' "
                             "(default: guessed from the parameter names)")
    parser.add_argument("--config", metavar="JSON", default=None,
                        help="for a constructor that takes a config object (__init__(self, config), minGPT/nanoGPT/"
                             "GPT-2/BERT style): its attributes as JSON, e.g. '{\"n_embd\": 16, \"n_head\": 4}'; "
                             "attributes not given are guessed by name")
    parser.add_argument("--call", metavar="HINTS", default=None,
                        help="what to take as given instead of detecting it: heads=N, layout=batch|seq, "
                             "causal=yes|no, inputs=x|qkv|q_kv; and how callers pass the mask, a claim the module "
                             "must keep: mask=keep|block|additive|lengths|key_padding (comma separated)")
    parser.add_argument("--lang", choices=LANGS, default=None,
                        help="language of the report (default: from LC_ALL/LC_MESSAGES/LANG, else en)")


def render(report: CheckReport, console: Console) -> None:
    """Print the report as a PASS / FAIL / ERROR panel with the conventions and roles found, its lines
    broken by ``wrap`` (never inside code, never cut off with an ellipsis)."""
    inner = max(console.width - 4, 20)  # the panel's border and padding take 4 columns
    body = Text(_wrapped([report.headline()], inner), style=STYLE[report.verdict], no_wrap=True)
    details = report.detail_lines()
    if details:
        body.append("\n" + _wrapped(details, inner))
    content = body
    if report.verdict != "error" and (report.conventions or report.roles):
        sections = [(say("conventions", report.lang), report.convention_lines()),
                    (say("roles", report.lang), report.role_lines())]
        label_width = max(cell_len(label) for label, lines in sections if lines)
        text_width = inner - label_width - 2
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column(no_wrap=True)
        for label, lines in sections:
            for index, line in enumerate(lines):
                if text_width >= 20:
                    table.add_row(label if index == 0 else "", Text(_wrapped([line], text_width), no_wrap=True))
                else:  # too narrow for two columns: the label on its own line
                    table.add_row(Text(_wrapped(([label] if index == 0 else []) + [line], inner), no_wrap=True))
        content = Table.grid()
        content.add_row(body)
        content.add_row("")
        content.add_row(table)
    colon = "：" if report.lang == "zh" else ": "
    title = Text(TITLE[report.verdict][report.lang == "zh"] + (colon + bug_name(report.bug, report.lang)
                                                                if report.bug else ""), style=STYLE[report.verdict])
    console.print(Panel(content, title=title, title_align="left", border_style=STYLE[report.verdict]))


def _wrapped(lines: list[str], width: int) -> str:
    return "\n".join(piece for line in lines for piece in wrap(line, width, cell_len))


def main(args: argparse.Namespace) -> int:
    """Run the check and print it; the return value is the exit code."""
    report = check(args.target, init=args.init, config=args.config, call=args.call, lang=resolve_lang(args.lang))
    render(report, Console(soft_wrap=False))
    return report.exit_code
