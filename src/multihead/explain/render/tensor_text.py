"""What both renderers show of a tensor: its layout line and a few 2-D slices, as strings.

The terminal and HTML renderers differ only in how they draw these; which slices, how many rows
and columns, and how numbers are written is decided once, here.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from multihead.explain.words import ui

MAX_SLICES = 4   # 2-D slices shown for a tensor with leading dims (e.g. B*H of them)
MAX_ROWS = 8
MAX_COLS = 7
ELLIPSIS = "…"


@dataclass
class Slice2D:
    """One 2-D slice of a tensor: `index` like "[0, 1]" ("" for a 2-D tensor), cells as strings."""

    index: str
    cells: list[list[str]]
    row_labels: list[str]
    col_labels: list[str]


def number(x: float) -> str:
    """4 decimals, like torch prints small tensors; infinities as -inf / inf."""
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    if math.isnan(x):
        return "nan"
    return f"{x:.4f}"


def _cut(n: int, limit: int) -> list[int | None]:
    """Indices to show out of n: all if n <= limit, else limit of them: the first ones, None (…), the last."""
    if n <= limit:
        return list(range(n))
    return list(range(limit - 2)) + [None, n - 1]


def layout_line(value: torch.Tensor, lang: str, layout: bool) -> str:
    """`shape (1, 6, 4)`, plus `· stride (...) · contiguous: yes` when the layout matters."""
    line = f"{ui('shape', lang)} {tuple(value.shape)}"
    if layout:
        yes_no = ui("yes" if value.is_contiguous() else "no", lang)
        colon = "：" if lang == "zh" else ": "
        line += f" · {ui('stride', lang)} {tuple(value.stride())} · {ui('contiguous', lang)}{colon}{yes_no}"
    return line


AXES = {"B": "axis_batch", "L": "axis_token", "H": "axis_head", "D": "axis_feature"}  # dims letter -> ui key
AXES_PLURAL = {"B": "axis_batches", "L": "axis_tokens", "H": "axis_heads", "D": "axis_features"}


def table_value(value, lang: str) -> str:
    """A table cell as text: Python bools as True/False (是/否 in Chinese), anything else as str()."""
    if isinstance(value, bool):
        return ui("true" if value else "false", lang)
    return str(value)


def cell_text(x, lang: str) -> str:
    """One tensor element as shown: bools as True/False (是/否 in Chinese), integers as themselves,
    floats with 4 decimals."""
    if isinstance(x, bool):
        return table_value(x, lang)
    if isinstance(x, int):
        return str(x)
    return number(x)


def axis_label(letter: str, i: int, lang: str, tokens: list[str] | None) -> str:
    """"token 0 (Your)" / "词元 0（Your）", "head 1" / "头 1": index i along the axis named by `letter`."""
    text = f"{ui(AXES[letter], lang)} {i}" if letter in AXES else f"{letter} {i}"
    if letter == "L" and tokens is not None and i < len(tokens):
        text += f"（{tokens[i]}）" if lang == "zh" else f" ({tokens[i]})"
    return text


def slice_title(index: tuple[int, ...], dims: str | None, lang: str, tokens: list[str] | None) -> str:
    """What a 2-D slice is: "[0, 1]" plain, or with named dims "[0, 1]: batch 0, token 1 (journey)"."""
    plain = ("[" + ", ".join(map(str, index)) + "]") if index else ""
    if dims is None or not index:
        return plain
    lead = [axis_label(letter, i, lang, tokens) for letter, i in zip(dims, index)]
    return plain + ("：" + "，".join(lead) if lang == "zh" else ": " + ", ".join(lead))


def axes_note(dims: str | None, lang: str) -> str:
    """"in each table: rows are heads, columns are features" for named dims, else ""."""
    if dims is None:
        return ""
    rows, cols = (ui(AXES_PLURAL.get(letter, "axis_features"), lang) for letter in dims[-2:])
    return ui("slice_axes", lang, rows=rows, cols=cols)


def slices(value: torch.Tensor, row_names: list[str] | None = None, dims: str | None = None,
           lang: str = "en", tokens: list[str] | None = None) -> tuple[list[Slice2D], int]:
    """Up to MAX_SLICES 2-D slices of `value` (rows and columns cut with …) and the total count.

    A 0-D or 1-D tensor becomes a single row. row_names label the rows (e.g. the tokens) when they
    match the row count. dims (one letter per dim, e.g. "BLHD") names the axes: each slice then says
    which batch item, token and head it is, and rows along L are named by `tokens`, rows along H "head h".
    Bool tensors show True/False (是/否), integer tensors their integers.
    """
    value = value.detach().cpu()
    if value.dim() < 2:
        value = value.reshape(1, -1)
    if dims is not None and len(dims) != value.dim():
        dims = None
    if not (value.dtype == torch.bool or not (value.is_floating_point() or value.is_complex())):
        value = value.to(torch.float64)
    lead = tuple(value.shape[:-2])
    total = math.prod(lead)
    picked = list(itertools.islice(itertools.product(*(range(n) for n in lead)), MAX_SLICES))
    rows, cols = value.shape[-2], value.shape[-1]
    row_idx, col_idx = _cut(rows, MAX_ROWS), _cut(cols, MAX_COLS)
    if dims is not None and dims[-2] == "L" and tokens is not None and len(tokens) == rows:
        row_names = tokens
    elif dims is not None and dims[-2] == "H":
        row_names = [axis_label("H", i, lang, None) for i in range(rows)]
    names = row_names if row_names is not None and len(row_names) == rows else [str(i) for i in range(rows)]
    out = []
    for index in picked:
        mat = value[index]
        cells = [[ELLIPSIS if (r is None or c is None) else cell_text(mat[r, c].item(), lang) for c in col_idx]
                 for r in row_idx]
        out.append(Slice2D(
            index=slice_title(index, dims, lang, tokens),
            cells=cells,
            row_labels=[ELLIPSIS if r is None else names[r] for r in row_idx],
            col_labels=[ELLIPSIS if c is None else str(c) for c in col_idx],
        ))
    return out, total


def more_slices_note(shown: int, total: int, lang: str) -> str:
    """'showing 4 of 24' when slices were left out, else ''."""
    return ui("showing", lang, shown=shown, total=total) if shown < total else ""


def tensor_note(dims: str | None, shown: int, total: int, lang: str) -> str:
    """The note under a tensor's slices, in brackets: what rows and columns are, how many slices are
    shown; "" when there is nothing to say."""
    notes = [n for n in (axes_note(dims, lang), more_slices_note(shown, total, lang)) if n]
    if not notes:
        return ""
    return "（" + "；".join(notes) + "）" if lang == "zh" else "(" + "; ".join(notes) + ")"


def heat_weights(weights: torch.Tensor) -> torch.Tensor:
    """Attention weights as (H, Lq, Lk) float64 for drawing (a 2-D (Lq, Lk) becomes one head)."""
    weights = weights.detach().to("cpu", torch.float64)
    return weights[None] if weights.dim() == 2 else weights
