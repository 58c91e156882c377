"""Attention heatmaps as inline SVG: one small <svg> per head, drawn by the browser itself.

The labels are real text, so the reader's fonts draw every script (Chinese tokens included) and the
page's EN/中文 switch changes them with the rest of the page: each word is written once per language,
with the class l-en or l-zh that the page's CSS shows or hides. Nothing is fetched, no image is made.
Shapes: weights (H, Lq, Lk) or (Lq, Lk); H heads, Lq queries (rows), Lk keys (columns).
"""
from __future__ import annotations

import math
from html import escape

from multihead.explain.words import ui
from multihead.explain.render.tensor_text import heat_weights

NUMBERS_UP_TO = 8     # cells show their weight as a number up to this many tokens
LABEL_CHARS = 10      # longer token names are cut with … (the full name is in the cell's tooltip)


def shade(weight: float) -> str:
    """Weight 0..1 as white..blue (#2a6f97); sqrt so that small weights still show (as the page's views)."""
    s = math.sqrt(min(max(weight, 0.0), 1.0))
    return "#%02x%02x%02x" % (round(255 - s * 213), round(255 - s * 144), round(255 - s * 104))


def in_langs(key: str, langs: tuple[str, ...], **values) -> str:
    """A label in each of `langs` as SVG tspans; one language needs no class."""
    if len(langs) == 1:
        return escape(ui(key, langs[0], **values))
    return "".join(f'<tspan class="l-{lang}">{escape(ui(key, lang, **values))}</tspan>' for lang in langs)


def cut(name: str) -> str:
    return name if len(name) <= LABEL_CHARS else name[: LABEL_CHARS - 1] + "…"


def head_svg(weights, h: int, tokens: list[str] | None, langs: tuple[str, ...]) -> str:
    """One head's heatmap (Lq, Lk) as an <svg>: queries down the left, keys across the top (rotated),
    a tooltip per cell (query, key, weight), the weights written in the cells when the map is small."""
    Lq, Lk = weights.shape
    names_q = tokens if tokens is not None and len(tokens) == Lq else [str(i) for i in range(Lq)]
    names_k = tokens if tokens is not None and len(tokens) == Lk else [str(j) for j in range(Lk)]
    small = max(Lq, Lk) <= NUMBERS_UP_TO
    cell = 30 if small else 14
    margin = 8 + 7 * max(len(cut(n)) for n in names_q + names_k)   # room for the longest label
    top = 18 + margin
    width, height = margin + Lk * cell + 4, top + Lq * cell + 4
    parts = [f'<svg class="heatmap" role="img" viewBox="0 0 {width} {height}" width="{width}" height="{height}">',
             f'<text class="title" x="{margin}" y="13">{in_langs("head_n", langs, n=h)}</text>']
    for i, name in enumerate(names_q):
        y = top + i * cell + cell / 2
        parts.append(f'<text class="tok" x="{margin - 4}" y="{y:.1f}" text-anchor="end" '
                     f'dominant-baseline="middle">{escape(cut(name))}</text>')
    for j, name in enumerate(names_k):
        x = margin + j * cell + cell / 2
        parts.append(f'<text class="tok" transform="translate({x:.1f},{top - 4}) rotate(-90)" '
                     f'dominant-baseline="middle">{escape(cut(name))}</text>')
    rows = weights.tolist()
    for i in range(Lq):
        for j in range(Lk):
            w = rows[i][j]
            x, y = margin + j * cell, top + i * cell
            tip = (f"<title>{escape(names_q[i])} → {escape(names_k[j])}: {w:.4f}</title>" if small else "")
            parts.append(f'<rect x="{x}" y="{y}" width="{cell}" height="{cell}" fill="{shade(w)}">{tip}</rect>')
            if small:
                colour = "#fff" if w > 0.6 else "#222"
                parts.append(f'<text class="num" x="{x + cell / 2}" y="{y + cell / 2}" fill="{colour}" '
                             f'text-anchor="middle" dominant-baseline="middle">{w:.2f}</text>')
    parts.append("</svg>")
    return "".join(parts)


def heatmaps_svg(weights, tokens: list[str] | None, langs: tuple[str, ...] = ("en",)) -> str:
    """Per-head heatmaps of weights (H, Lq, Lk) or (Lq, Lk), each an inline <svg>, with an axis legend
    ("rows: queries, columns: keys") in each of `langs`, wrapped in <div class="heatmaps">."""
    weights = heat_weights(weights)
    legend = "".join(f'<span class="l-{lang}">{escape(ui("heat_legend", lang))}</span>' if len(langs) > 1
                     else escape(ui("heat_legend", lang)) for lang in langs)
    heads = "".join(head_svg(weights[h], h, tokens, langs) for h in range(weights.shape[0]))
    return f'<div class="heatmaps"><div class="note">{legend}</div><div class="heads">{heads}</div></div>'
