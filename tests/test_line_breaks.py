"""One line breaking for every terminal text (check's report, explain's stories and lists, --help): Chinese
lines fill the width (a Chinese character is two columns), and a command, a bug id, a topic name or a run
of code is never cut."""
from __future__ import annotations

import pytest

from multihead.explain.topics import TOPICS
from multihead.terminal.line_breaks import break_offsets, cells, narrowest, wrap

UNKNOWN_TOPIC_ZH = ("没有名为“reshape-transpose”的主题。你要找的是不是：reshape-then-transpose、k-transpose、"
                    "split-heads-transpose？（全部主题：multihead explain --list）")


def lines_of(plain: str, width: int) -> list[str]:
    cuts = [0, *break_offsets(plain, width), len(plain)]
    return [plain[a:b].rstrip() for a, b in zip(cuts, cuts[1:], strict=False)]


def test_chinese_lines_break_between_characters_and_fill_the_width():
    plain = "为什么：view 只是给同一块内存换个形状，转置只交换两个步幅；这样每个头都成了自己的矩阵。" * 3
    lines = lines_of(plain, 40)
    assert "".join(lines).replace(" ", "") == plain.replace(" ", "")
    assert all(cells(line) <= 40 for line in lines)
    assert all(cells(line) >= 36 for line in lines[:-1])  # breaking at spaces alone would stop at "view"
    assert not any(line[0] in "，。；：" for line in lines[1:])


def test_english_lines_break_at_spaces_and_a_word_wider_than_the_line_is_folded():
    assert wrap("one two three " + "x" * 25, 10) == ["one two", "three", "x" * 10, "x" * 10, "x" * 5]


def test_punctuation_keeps_the_word_it_touches_on_its_line():
    assert lines_of("这里用的是 self.d_model。然后", 24) == ["这里用的是", "self.d_model。然后"]
    assert lines_of("一二三四五六七八（AttributeError）", 18) == ["一二三四五六七八", "（AttributeError）"]
    assert lines_of("一二三四五六七八再词1的……）", 24) == ["一二三四五六七八再词1", "的……）"]


def test_code_is_cut_only_at_its_own_spaces():
    text = "被屏蔽的分数应填成 -inf（masked_fill(~keep, float('-inf'))），这样剩下的权重之和仍为 1。"
    for width in range(22, 48):  # from the width of the longest run of code on
        lines = wrap(text, width)
        assert all(cells(line) <= width for line in lines), (width, lines)
        assert "".join(lines).replace(" ", "") == text.replace(" ", "")
        assert any("masked_fill(~keep," in line for line in lines)
        assert not any(line.startswith(("，", "）", "。")) for line in lines)


@pytest.mark.parametrize("width", range(26, 81))
def test_a_command_and_topic_names_are_never_cut(width):
    """The issue's cuts were `reshape-then-transp` / `ose` and `mul` / `tihead explain --list`."""
    lines = wrap(UNKNOWN_TOPIC_ZH, width)
    assert all(cells(line) <= width for line in lines)
    assert "".join(lines) == UNKNOWN_TOPIC_ZH
    assert any("multihead explain --list" in line for line in lines)
    for name in ("reshape-then-transpose", "k-transpose", "split-heads-transpose"):
        assert any(name in line for line in lines), (name, lines)
    pointer = "详细讲解：multihead explain reshape-then-transpose"   # the command alone is 40 columns
    assert any("multihead explain reshape-then-transpose" in line for line in wrap(pointer, width)) == (width >= 40)


def test_a_command_keeps_its_options_and_metavars_but_not_the_prose_after_it():
    text = "Each question below has a topic: multihead explain TOPIC --html PATH for a page."
    lines = wrap(text, 40)
    assert "multihead explain TOPIC --html PATH" in lines[1] and lines[0].endswith("topic:")


def test_a_piece_wider_than_the_line_breaks_at_spaces_then_paths_and_ids_then_anywhere():
    assert wrap("a/very/long/path/to/attention.py:Attention", 14) == ["a/very/long/", "path/to/", "attention.py:",
                                                                     "Attention"]
    assert wrap("详细讲解：multihead explain reshape-then-transpose", 16) == [
        "详细讲解：", "multihead", "explain reshape-", "then-transpose"]  # the id alone is wider than 16
    assert wrap("甲" * 5, 1) == ["甲"] * 5  # narrower than one character: one per line, nothing lost


def test_leading_spaces_and_paragraphs_are_kept():
    assert wrap("  indented text here\nnext", 12) == ["  indented", "text here", "next"]


def test_narrowest_is_the_widest_piece_that_must_stay_whole():
    assert narrowest("详细讲解：multihead explain reshape-then-transpose") == cells("reshape-then-transpose")
    assert narrowest("中文") == 2 and narrowest("") == 0


def test_every_topic_name_fits_whole_in_the_narrowest_useful_width():
    for name in TOPICS:
        assert wrap(f"看这里：{name}。", cells(name) + 2)[-1].startswith(name)
