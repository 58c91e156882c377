"""The commands' argument parser in the user's language: --help, usage and usage errors in English or
Chinese, their lines broken by multihead.terminal.line_breaks (a Chinese character is two columns wide, an option
or a topic name is never cut).

Each tool writes its own help texts in both languages (``pick(lang, en, zh)``); this module says the
words argparse itself prints ("usage:", the section titles, "show this help", the common errors).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Mapping

from multihead.terminal.language import pick
from multihead.terminal.line_breaks import cells, wrap

ERRORS_ZH = (  # argparse's usage errors (Python 3.11 to 3.13), most specific first
    (r"argument (.+?): invalid choice: (.+?) \(choose from (.+)\)", "参数 {0} 的取值 {1} 无效（可选：{2}）"),
    (r"argument (.+?): expected one argument", "参数 {0} 后面需要一个值"),
    (r"argument (.+?): invalid (\w+) value: (.+)", "参数 {0} 需要 {1} 类型的值，收到的是 {2}"),
    (r"argument (.+?): not allowed with argument (.+)", "参数 {0} 不能和 {1} 一起用"),
    (r"the following arguments are required: (.+)", "缺少必需的参数：{0}"),
    (r"unrecognized arguments: (.+)", "无法识别的参数：{0}"),
    (r"one of the arguments (.+) is required", "{0} 这几个参数必须给出一个"),
)


def help_texts(table: Mapping[str, tuple[str, str]], lang: str) -> Callable[[str], str]:
    """`text(option)`: a tool's help text for `option` in `lang`, from its (English, Chinese) table, with "%"
    escaped for argparse."""
    def text(option: str) -> str:
        return pick(lang, *table[option]).replace("%", "%%")

    return text


def error_text(message: str, lang: str) -> str:
    """argparse's error `message` in `lang`; a message with no translation stays in English."""
    if lang != "zh":
        return message
    for pattern, template in ERRORS_ZH:
        found = re.fullmatch(pattern, message)
        if found:
            return template.format(*found.groups())
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
        prefix = pick(self.lang, "usage: ", "用法：") if prefix is None else prefix
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
        self._positionals.title = pick(lang, "positional arguments", "位置参数")
        self._optionals.title = pick(lang, "options", "选项")
        self.add_argument("-h", "--help", action="help",
                          help=pick(lang, "show this help message and exit", "显示本帮助并退出"))

    def error(self, message: str):
        """Usage, then the error in the parser's language; exits with status 2."""
        self.print_usage(sys.stderr)
        self.exit(2, pick(self.lang, f"{self.prog}: error: {message}\n",
                          f"{self.prog}：错误：{error_text(message, self.lang)}\n"))
