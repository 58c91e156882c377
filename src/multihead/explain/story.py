"""A story: what a walkthrough step or a topic says, as data, before anyone renders it.

Topics and steps only *fill* a Story; the terminal (rich) and HTML renderers only *draw* one.
Every claim is computed on live tensors and checked when it is told (`Story.check`), so a
demonstration that stopped being true shows up as a failed check, never as a quiet lie.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

LANGS = ("en", "zh")


@dataclass
class Block:
    """One piece of a story. kind: heading | text | code | tensor | table | check | figure."""

    kind: str
    data: dict[str, Any]


@dataclass
class Story:
    """An ordered list of blocks in one language, plus the outcome of every check told."""

    lang: str = "en"
    blocks: list[Block] = field(default_factory=list)

    def pick(self, en: str, zh: str) -> str:
        """The story's language version of a text: a label, a table column, a code block."""
        return zh if self.lang == "zh" else en

    def heading(self, en: str, zh: str) -> None:
        self.add_heading(self.pick(en, zh))

    def text(self, en: str, zh: str) -> None:
        self.add_text(self.pick(en, zh))

    def add_heading(self, text: str) -> None:
        """A heading already in the story's language (topics take theirs from the words files)."""
        self.blocks.append(Block("heading", {"text": text}))

    def add_text(self, text: str) -> None:
        """A paragraph already in the story's language."""
        self.blocks.append(Block("text", {"text": text}))

    def code(self, source: str) -> None:
        self.blocks.append(Block("code", {"source": source.strip("\n")}))

    def tensor(self, label: str, value, *, layout: bool = False, rows: list[str] | None = None,
               dims: str | None = None, tokens: list[str] | None = None) -> None:
        """Show a tensor; with layout=True also its strides and whether it is contiguous.

        rows: optional names for the rows of each 2-D slice (e.g. the tokens).
        dims: one letter per dim from B (batch), L (token), H (head), D (feature), e.g. "BLHD": each
        slice then says which batch item, token and head it shows; tokens name the L positions.
        """
        self.blocks.append(Block("tensor", {"label": label, "value": value.detach(), "layout": layout,
                                            "rows": rows, "dims": dims, "tokens": tokens}))

    def table(self, columns: list[str], rows: list[list[Any]], title: str = "") -> None:
        self.blocks.append(Block("table", {"columns": columns, "rows": rows, "title": title}))

    def figure(self, label: str, weights, *, tokens: list[str] | None = None) -> None:
        """Attention heatmaps: weights (H, Lq, Lk) or (Lq, Lk); tokens label both axes (Lq == Lk).

        The HTML report draws them as inline SVG (render_svg); the terminal draws small shaded grids.
        """
        self.blocks.append(Block("figure", {"label": label, "weights": weights.detach(), "tokens": tokens}))

    def check(self, en: str, zh: str, ok: bool, detail: str = "") -> bool:
        """State a claim together with its live verdict; a false claim is recorded as failed."""
        return self.add_check(self.pick(en, zh), ok, detail)

    def add_check(self, claim: str, ok: bool, detail: str = "") -> bool:
        """`check` for a claim already in the story's language."""
        self.blocks.append(Block("check", {"claim": claim, "ok": bool(ok), "detail": detail}))
        return bool(ok)

    @property
    def checks(self) -> list[Block]:
        return [b for b in self.blocks if b.kind == "check"]

    @property
    def failed_checks(self) -> list[str]:
        return [b.data["claim"] for b in self.blocks if b.kind == "check" and not b.data["ok"]]
