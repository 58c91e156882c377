"""What both renderers show of a tensor: its layout line and a few 2-D slices, as strings.

The terminal and HTML renderers differ only in how they draw these; which slices, how many rows
and columns, and how numbers are written is decided once, here.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from multihead.explain.lang import ui

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


def slices(value: torch.Tensor, row_names: list[str] | None = None) -> tuple[list[Slice2D], int]:
    """Up to MAX_SLICES 2-D slices of `value` (rows and columns cut with …) and the total count.

    A 0-D or 1-D tensor becomes a single row. row_names label the rows (e.g. the tokens) when they
    match the row count.
    """
    value = value.detach().to("cpu", torch.float64)
    if value.dim() < 2:
        value = value.reshape(1, -1)
    lead = tuple(value.shape[:-2])
    total = math.prod(lead)
    picked = list(itertools.islice(itertools.product(*(range(n) for n in lead)), MAX_SLICES))
    rows, cols = value.shape[-2], value.shape[-1]
    row_idx, col_idx = _cut(rows, MAX_ROWS), _cut(cols, MAX_COLS)
    names = row_names if row_names is not None and len(row_names) == rows else [str(i) for i in range(rows)]
    out = []
    for index in picked:
        mat = value[index]
        cells = [[ELLIPSIS if (r is None or c is None) else number(mat[r, c].item()) for c in col_idx]
                 for r in row_idx]
        out.append(Slice2D(
            index=("[" + ", ".join(map(str, index)) + "]") if index else "",
            cells=cells,
            row_labels=[ELLIPSIS if r is None else names[r] for r in row_idx],
            col_labels=[ELLIPSIS if c is None else str(c) for c in col_idx],
        ))
    return out, total


def more_slices_note(shown: int, total: int, lang: str) -> str:
    """'showing 4 of 24' when slices were left out, else ''."""
    return ui("showing", lang, shown=shown, total=total) if shown < total else ""


def heat_weights(weights: torch.Tensor) -> torch.Tensor:
    """Attention weights as (H, Lq, Lk) float64 for drawing (a 2-D (Lq, Lk) becomes one head)."""
    weights = weights.detach().to("cpu", torch.float64)
    return weights[None] if weights.dim() == 2 else weights
