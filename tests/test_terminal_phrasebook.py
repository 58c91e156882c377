"""The one mechanism for bilingual text: a phrasebook folder of en.json and zh.json. The terminal's own
words (argparse's, the `multihead` command's) live in one, and a phrasebook reports every way its two
languages drift apart."""
from __future__ import annotations

import json
import re

import pytest

from multihead.errors import AttentionError
from multihead.terminal import help as terminal_help
from multihead.terminal.help import WORDS, error_pattern, error_text
from multihead.terminal.phrasebook import Phrasebook, fill, flatten, placeholders, write_phrasebook

CJK = re.compile(r"[\u4e00-\u9fff]")


def write_book(folder, en: dict, zh: dict) -> Phrasebook:
    for lang, tree in (("en", en), ("zh", zh)):
        (folder / f"{lang}.json").write_text(json.dumps(tree, ensure_ascii=False), encoding="utf-8")
    return Phrasebook(folder)


def test_the_terminal_words_are_in_step_and_chinese_in_chinese():
    assert WORDS.out_of_step() == []
    zh = flatten(WORDS.words("zh"))
    assert zh and all(CJK.search(text) for text in zh.values())


def test_a_phrasebook_says_fills_and_pairs(tmp_path):
    book = write_book(tmp_path, {"s": {"a": "{n} keys", "code": ["x = 1", "y = {y}"]}},
                      {"s": {"a": "{n} 个键", "code": ["x = 1", "y = {y}"]}})
    assert book.say("zh", "s", "a", n=3) == "3 个键" and book.say("en", "s", "code", y=2) == "x = 1\ny = 2"
    assert book.pairs("s") == {"a": ("{n} keys", "{n} 个键"), "code": ("x = 1\ny = {y}", "x = 1\ny = {y}")}
    assert placeholders("{n} of {total:.2f} {{not}}") == ["n", "total"] and fill(["a {x}", "b"], {"x": 1}) == "a 1\nb"
    with pytest.raises(AttentionError, match="lang must be one of"):
        book.words("fr")


def test_out_of_step_names_every_difference(tmp_path):
    book = write_book(tmp_path, {"s": {"a": "{n} keys", "b": "", "c": ["x"], "d": "one"}},
                      {"s": {"a": "{m} 个键", "b": "空", "c": "x", "d": "一"}})
    assert book.out_of_step() == ["s/a: placeholders differ: English ['n'], Chinese ['m']",
                                  "s/b: English is empty", "s/c: English is a list, Chinese a str"]
    (tmp_path / "zh.json").write_text(json.dumps({"s": {"a": "{n}", "b": "b", "c": ["x"]}}), encoding="utf-8")
    assert Phrasebook(tmp_path).out_of_step() == ["s/d: only in en"]


def test_argparse_errors_are_read_from_their_english_words():
    assert error_pattern("argument {0}: expected one argument").fullmatch("argument --layer: expected one argument")
    message = "argument --lang: invalid choice: 'fr' (choose from 'en', 'zh')"
    assert error_text(message, "en") == message
    assert error_text(message, "zh") == "参数 --lang 的取值 'fr' 无效（可选：'en', 'zh'）"
    assert error_text("argument --layer: invalid int value: 'x'", "zh") == "参数 --layer 需要 int 类型的值，收到的是 'x'"
    assert error_text("something argparse never said", "zh") == "something argparse never said"


def test_the_commands_words_come_from_the_phrasebook(capsys):
    from multihead import cli

    parser = cli.build_parser(None, "zh")
    assert parser.description == terminal_help.say("zh", "command", "description")
    with pytest.raises(SystemExit):
        parser.parse_args(["--nope"])
    err = capsys.readouterr().err
    assert err.startswith("用法：") and "multihead：错误：" in err


def test_a_table_of_pairs_moves_into_a_phrasebook_and_reads_back_the_same(tmp_path):
    """The checker's (English, Chinese) tables, e.g. checker/bugs/sentences.py's, move in one call."""
    table = {"inputs:x": ("{call}({args}): self-attention on one input", "{call}({args})：只有一个输入的自注意力"),
             "causal:no": ("not causal", "不带因果掩码")}
    book = write_phrasebook(tmp_path / "words", {"conventions": table})
    assert book.pairs("conventions") == table and book.out_of_step() == []
    assert book.say("zh", "conventions", "inputs:x", call="f", args="x") == "f(x)：只有一个输入的自注意力"
    assert "只有一个输入" in (tmp_path / "words" / "zh.json").read_text(encoding="utf-8")
