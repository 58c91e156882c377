"""Drawing stories in the terminal: 80 columns at most, checks marked, tensors cut to fit, heatmap
grids; plus the shared tensor presentation both renderers use (line breaking: test_line_breaks.py, the
language rule: test_language.py)."""

from __future__ import annotations

import pytest
import torch
from rich.cells import cell_len
from rich.console import Console

from multihead.explain.render import tensor_text as present
from multihead.explain.render.terminal import MAX_GRID_HEADS, render, render_summary
from multihead.explain.story import Story
from multihead.explain.walkthrough.steps import tell


def drawn(story: Story, width: int = 80) -> str:
    console = Console(width=width, record=True, force_terminal=False)
    render(story, console)
    render_summary([story], console, story.lang)
    return console.export_text()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_walkthrough_fits_80_columns(lang):
    story = Story(lang)
    tell(story)
    text = drawn(story)
    widest = max(cell_len(line) for line in text.splitlines())
    assert widest <= 80, [line for line in text.splitlines() if cell_len(line) > 80][:3]
    assert text.count("✓") == len(story.checks)
    assert ("All" in text) if lang == "en" else ("全部" in text)


def test_failed_checks_are_marked_and_listed():
    story = Story("en")
    story.check("two and two make five", "二加二等于五", 2 + 2 == 5, "4 != 5")
    story.check("two and two make four", "二加二等于四", 2 + 2 == 4)
    text = drawn(story)
    assert "✗ FAILED two and two make five" in text and "[4 != 5]" in text
    assert "1 of 2 checks FAILED" in text


def test_wide_tensors_are_cut_with_an_ellipsis_and_a_note():
    story = Story("en")
    story.tensor("big", torch.arange(5 * 3 * 20 * 30, dtype=torch.float32).view(5, 3, 20, 30))
    text = drawn(story)
    assert "…" in text and "(showing 4 of 15)" in text
    assert max(cell_len(line) for line in text.splitlines()) <= 80


def test_figures_draw_shaded_grids_for_a_few_heads_only():
    weights = torch.eye(3).expand(2, 3, 3)
    story = Story("en")
    story.figure("w", weights, tokens=["a", "b", "c"])
    text = drawn(story)
    assert text.count("██") == 2 * 3 + 1 and "head 1" in text  # one full cell per row and head, + legend
    assert "  b   ██" in text  # token b attends to itself: the second cell
    many = Story("en")
    many.figure("w", torch.eye(3).expand(MAX_GRID_HEADS + 1, 3, 3))
    assert "head 0" not in drawn(many)


def test_slices_keep_the_corners_and_name_the_rows():
    value = torch.arange(2 * 10 * 9, dtype=torch.float64).view(2, 10, 9)
    parts, total = present.slices(value, row_names=[f"t{i}" for i in range(10)])
    assert total == 2 and [p.index for p in parts] == ["[0]", "[1]"]
    first = parts[1]
    assert len(first.cells) == present.MAX_ROWS and len(first.cells[0]) == present.MAX_COLS
    assert first.row_labels[0] == "t0" and first.row_labels[-1] == "t9" and first.row_labels[-2] == "…"
    assert first.cells[-1][-1] == present.number(value[1, 9, 8].item())
    assert present.number(float("-inf")) == "-inf" and present.number(0.12345) == "0.1235"


def test_layout_line_shows_strides_only_when_asked():
    t = torch.zeros(2, 3, 4).transpose(1, 2)
    assert present.layout_line(t, "en", False) == "shape (2, 4, 3)"
    assert present.layout_line(t, "en", True) == "shape (2, 4, 3) · stride (12, 1, 4) · contiguous: no"
    assert present.layout_line(t, "zh", True) == "形状 (2, 4, 3) · 步幅 (12, 1, 4) · 连续：否"


def test_table_cells_and_long_headings_wrap_instead_of_being_cut():
    question = "多头注意力的堆叠实现和权重分割实现是一回事吗？为什么权重分割更高效？"
    title = "batch_size, _, seq_length, d_k = x.size(): what `_` is for (and the unused d_k)"
    story = Story("zh")
    story.heading(title, title)
    story.table(["问题"], [[question]])   # one column, so its lines read in order
    text = drawn(story, 40)
    assert "…" not in text and max(cell_len(line) for line in text.splitlines()) <= 40
    squeezed = "".join(text.split())
    for whole in (title, question):
        assert "".join(whole.split()) in squeezed


def test_table_and_tensor_text_is_literal_not_rich_markup():
    story = Story("en")
    story.table(["[col]"], [["[nan, nan]"], ["[bold]x"]])
    story.tensor("t", torch.zeros(2, 2), rows=["[CLS]", "[SEP]"])
    console = Console(width=80, record=True, color_system=None)
    render(story, console)
    text = console.export_text()
    for literal in ("[col]", "[nan, nan]", "[bold]x", "[CLS]", "[SEP]"):
        assert literal in text
