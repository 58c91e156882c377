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

from multihead.checker.bugs.report import CheckReport
from multihead.checker.run import check
from multihead.checker.bugs.sentences import LANGS, bug_name, say
from multihead.terminal.help import help_texts
from multihead.terminal.language import resolve_lang
from multihead.terminal.line_breaks import wrap

STYLE = {"pass": "bold green", "fail": "bold red", "error": "bold yellow"}
TITLE = {"pass": ("PASS", "通过"), "fail": ("FAIL", "未通过"), "error": ("ERROR", "错误")}


HELP = {  # option -> (English, Chinese)
    "target": ("your module's file and class name, e.g. my_attention.py:MultiHeadAttention, or an attention "
               "function's, e.g. my_attention.py:scaled_dot_product",
               "你的模块所在的文件和类名，例如 my_attention.py:MultiHeadAttention；也可以是注意力函数，"
               "例如 my_attention.py:scaled_dot_product"),
    "init": ("constructor keyword arguments as JSON, e.g. '{\"d_model\": 16, \"num_heads\": 4}' "
             "(default: guessed from the parameter names)",
             "构造函数的关键字参数，用 JSON 写，例如 '{\"d_model\": 16, \"num_heads\": 4}'"
             "（不给的话，按参数名猜）"),
    "config": ("for a constructor that takes a config object (__init__(self, config), minGPT/nanoGPT/GPT-2/BERT "
               "style): its attributes as JSON, e.g. '{\"n_embd\": 16, \"n_head\": 4}'; attributes not given are "
               "guessed by name",
               "构造函数只收一个配置对象时（__init__(self, config)，minGPT、nanoGPT、GPT-2、BERT 都是这种写法），"
               "用 JSON 给出它的属性，例如 '{\"n_embd\": 16, \"n_head\": 4}'；没给的属性按名字猜"),
    "call": ("what to take as given instead of detecting it: heads=N, layout=batch|seq, causal=yes|no, "
             "inputs=x|qkv|q_kv; and how callers pass the mask, a claim the module must keep: "
             "mask=keep|block|additive|lengths|key_padding (comma separated)",
             "直接告诉检查器、不用它去探测的事项，用逗号隔开：heads=N（头数）、layout=batch|seq（批量维在前还是"
             "序列维在前）、causal=yes|no（是否因果）、inputs=x|qkv|q_kv（forward 收几个输入）；还有调用者怎样传掩码，"
             "这是模块必须遵守的约定：mask=keep|block|additive|lengths|key_padding"),
    "lang": ("language of the report (default: from LANGUAGE/LC_ALL/LC_MESSAGES/LANG, else en)",
             "报告用的语言（默认按 LANGUAGE、LC_ALL、LC_MESSAGES、LANG 判断，都没设就用英文）"),
}


def configure(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """Add the check subcommand's arguments, their help in `lang`."""
    text = help_texts(HELP, lang)
    parser.add_argument("target", metavar="FILE.py:Class", help=text("target"))
    parser.add_argument("--init", metavar="JSON", default=None, help=text("init"))
    parser.add_argument("--config", metavar="JSON", default=None, help=text("config"))
    parser.add_argument("--call", metavar="HINTS", default=None, help=text("call"))
    parser.add_argument("--lang", choices=LANGS, default=None, help=text("lang"))


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
    return "\n".join(piece for line in lines for piece in wrap(line, width))


def main(args: argparse.Namespace) -> int:
    """Run the check and print it; the return value is the exit code."""
    report = check(args.target, init=args.init, config=args.config, call=args.call, lang=resolve_lang(args.lang))
    render(report, Console(soft_wrap=False))
    return report.exit_code
