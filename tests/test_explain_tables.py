"""How explain shows tensors and tables: bools as True/False (是/否 in Chinese, never True/False),
integers as integers, and a (B, L, H, D) slice saying which index is the token and which the head."""
from __future__ import annotations

import io

import torch
from rich.console import Console

from multihead.explain.render.tensor_text import slices, table_value, tensor_note
from multihead.explain.render.html import story_html
from multihead.explain.render.terminal import render
from multihead.explain.story import Story

TOKENS = ["Your", "journey", "starts"]


def terminal(story: Story) -> str:
    console = Console(width=80, record=True, file=io.StringIO())
    render(story, console)
    return console.export_text()


def test_bool_masks_read_true_false_in_english_and_words_in_chinese():
    blocked = torch.triu(torch.ones(3, 3, dtype=torch.bool), diagonal=1)   # (L, L)
    english, _ = slices(blocked, TOKENS, lang="en")
    chinese, _ = slices(blocked, TOKENS, lang="zh")
    assert english[0].cells[0] == ["False", "True", "True"] and chinese[0].cells[0] == ["否", "是", "是"]
    for lang in ("en", "zh"):
        story = Story(lang)
        story.tensor("blocked", blocked, rows=TOKENS)
        story.table(["tensor", "is_contiguous()"], [["x", True], ["y", False]])
        shown = terminal(story) + story_html(story)
        assert "0.0000" not in shown and "1.0000" not in shown
        assert ("True" in shown) == (lang == "en") and ("False" in shown) == (lang == "en")
    assert table_value(True, "zh") == "是" and table_value(3, "zh") == "3"


def test_integer_tensors_show_integers():
    parts, _ = slices(torch.tensor([[1, 20], [300, 4]]), lang="en")
    assert parts[0].cells == [["1", "20"], ["300", "4"]]


def test_view_b_l_h_d_slices_say_which_index_is_the_token_and_which_the_head():
    x = torch.arange(1 * 3 * 2 * 2, dtype=torch.float32).view(1, 3, 2, 2)    # (B, L, H, D)
    parts, total = slices(x, dims="BLHD", lang="en", tokens=TOKENS)
    assert total == 3 and parts[1].index == "[0, 1]: batch 0, token 1 (journey)"
    assert parts[1].row_labels == ["head 0", "head 1"]
    turned, _ = slices(x.transpose(1, 2), dims="BHLD", lang="zh", tokens=TOKENS)   # (B, H, L, D)
    assert turned[1].index == "[0, 1]：样本 0，头 1" and turned[1].row_labels == TOKENS
    assert tensor_note("BLHD", 4, 6, "en") == "(in each table the rows are heads, the columns features; showing 4 of 6)"
    assert tensor_note("BHLD", 2, 2, "zh") == "（每张表中，行是词元，列是特征）"
    assert tensor_note(None, 2, 2, "en") == ""


def test_the_walkthrough_labels_its_view_slices(capsys):
    from multihead.explain.walkthrough.steps import default_setup, tell

    story = Story("en")
    tell(story, default_setup())
    text = terminal(story)
    assert "[0, 1]: batch 0, token 1" in " ".join(text.split()) and "rows are heads" in text
