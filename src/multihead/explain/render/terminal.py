"""Draw a Story in the terminal with rich: rules for headings, syntax-coloured code, tensors as small
tables, checks as ✓/✗ lines, and attention weights as shaded grids. Fits an 80-column terminal.
"""
from __future__ import annotations

from rich import box
from rich.cells import cell_len
from rich.columns import Columns
from rich.console import Console, Group, RenderableType
from rich.measure import Measurement
from rich.padding import Padding
from rich.rule import Rule
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from multihead.explain.words import ui
from multihead.explain.render.tensor_text import heat_weights, layout_line, slices, table_value, tensor_note
from multihead.explain.story import Block, Story
from multihead.terminal.line_breaks import break_offsets, narrowest

SHADES = " ░▒▓█"      # weight 0 .. 1, two characters per cell
MAX_GRID_HEADS = 4    # more heads than this (e.g. BERT's 12) are left to the HTML report's heatmaps
LABEL_WIDTH = 8       # token names are cut to this many columns
UNBOUNDED = 10_000    # a width no terminal has: measures a table's true minimum


class Wrapped:
    """A rich Text broken into lines by `multihead.terminal.line_breaks` (styles kept): Chinese lines fill the width,
    and a command, an id or a topic name is never cut.

    It also measures itself, so a table column holding it narrows by wrapping, never by cutting.
    """

    def __init__(self, text: Text):
        self.text = text

    def __rich_console__(self, console, options):
        for line in self.text.split("\n"):
            for part in line.divide(break_offsets(line.plain, options.max_width)):
                part.rstrip()
                part.no_wrap = True
                yield part

    def __rich_measure__(self, console, options) -> Measurement:
        plain = self.text.plain
        widest_line = max(cell_len(line.rstrip()) for line in plain.split("\n"))
        return Measurement(min(narrowest(plain), options.max_width), min(widest_line, options.max_width))


class Heading:
    """A heading as a rule with its title; a title too wide for one line is wrapped above the rule."""

    def __init__(self, title: str):
        self.title = Text(title, style="bold cyan")

    def __rich_console__(self, console, options):
        if cell_len(self.title.plain) + 6 <= options.max_width:
            yield Rule(self.title, align="left", style="cyan")
            return
        yield Wrapped(self.title)
        yield Rule(style="cyan")


def make_console(width: int | None = None) -> Console:
    """A console on stdout; width from the terminal (or $COLUMNS), unless given."""
    return Console(width=width, highlight=False, soft_wrap=False)


def short(label: str) -> str:
    return label if len(label) <= LABEL_WIDTH else label[: LABEL_WIDTH - 1] + "…"


def _heading(block: Block, lang: str) -> RenderableType:
    return Heading(block.data["text"])


def _text(block: Block, lang: str) -> RenderableType:
    return Wrapped(Text(block.data["text"]))


def _code(block: Block, lang: str) -> RenderableType:
    syntax = Syntax(block.data["source"], "python", theme="ansi_dark", word_wrap=True,
                    background_color="default")
    return Padding(syntax, (0, 0, 0, 2))


def _matrix(index: str, cells, row_labels, col_labels) -> Table:
    table = Table(title=index or None, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1),
                  title_style="dim", header_style="dim", show_edge=False)
    table.add_column("", style="dim", no_wrap=True)
    for label in col_labels:
        table.add_column(Text(label), justify="right", no_wrap=True)
    for label, row in zip(row_labels, cells, strict=True):  # Text: "[CLS]" or "[nan]" is not markup
        table.add_row(Text(short(label)), *(Text(cell) for cell in row))
    return table


def _tensor(block: Block, lang: str) -> RenderableType:
    value = block.data["value"]
    head = Text.assemble((block.data["label"], "bold"), "  ",
                         (layout_line(value, lang, block.data["layout"]), "magenta"))
    parts, total = slices(value, block.data.get("rows"), block.data.get("dims"), lang, block.data.get("tokens"))
    tables = [_matrix(s.index, s.cells, s.row_labels, s.col_labels) for s in parts]
    items: list[RenderableType] = [head, Columns(tables, padding=(0, 3))]
    note = tensor_note(block.data.get("dims"), len(parts), total, lang)
    if note:
        items.append(Wrapped(Text(note, style="dim")))
    return Padding(Group(*items), (0, 0, 0, 2))


def cell(value) -> Wrapped:
    """A table cell or header: literal text (never rich markup), wrapped to the column, never cut."""
    return Wrapped(Text(str(value)))


class FittedTable:
    """A table of text cells that never cuts a cell's code, ids or names: drawn as a table where its columns
    fit the width without folding any of them, else row by row, each value under its column's name."""

    def __init__(self, columns: list[str], rows: list[list[str]], title: str | None = None,
                 box_style=box.SIMPLE_HEAVY, first_style: str | None = None):
        self.columns, self.rows, self.title = columns, rows, title
        self.box_style, self.first_style = box_style, first_style

    def table(self) -> Table:
        table = Table(title=self.title, box=self.box_style, title_style="bold")
        for index, column in enumerate(self.columns):
            table.add_column(cell(column), style=self.first_style if index == 0 else None)
        for row in self.rows:
            table.add_row(*(cell(value) for value in row))
        return table

    def __rich_console__(self, console, options):
        table = self.table()
        unbounded = options.update(width=UNBOUNDED)   # a measure clamped to the width would always fit
        if Measurement.get(console, unbounded, table).minimum <= options.max_width:
            yield table
            return
        if self.title:
            yield Wrapped(Text(self.title, style="bold"))
        colon = "：" if any(cell_len(c) > len(c) for c in self.columns) else ": "
        for row in self.rows:
            yield Text("")
            for column, value in zip(self.columns, row, strict=True):
                yield Wrapped(Text.assemble((column + colon, "dim"), str(value)))


def _table(block: Block, lang: str) -> RenderableType:
    rows = [[table_value(value, lang) for value in row] for row in block.data["rows"]]
    return Padding(FittedTable(block.data["columns"], rows, block.data["title"] or None), (0, 0, 0, 2))


def _check(block: Block, lang: str) -> RenderableType:
    ok = block.data["ok"]
    mark, style = ("✓", "green") if ok else ("✗ " + ui("failed", lang), "bold red")
    line = Text.assemble((mark + " ", style), block.data["claim"])
    if block.data["detail"]:
        line.append(f"  [{block.data['detail']}]", style="dim")
    return Wrapped(line)


def _grid(h: int, weights, tokens: list[str] | None, lang: str) -> Text:
    """One head's weights (Lq, Lk) as rows of shaded cells, each row labelled with its token."""
    lq = weights.shape[0]
    names = tokens if tokens is not None and len(tokens) == lq else [str(i) for i in range(lq)]
    grid = Text(f"{ui('head', lang)} {h}\n", style="bold")
    for i in range(lq):
        grid.append(f"{short(names[i]):>{LABEL_WIDTH}} ", style="dim")
        for w in weights[i].tolist():
            grid.append(SHADES[round(min(max(w, 0.0), 1.0) * (len(SHADES) - 1))] * 2, style="blue")
        grid.append("\n")
    return grid


def _figure(block: Block, lang: str) -> RenderableType | None:
    weights = heat_weights(block.data["weights"])
    if weights.shape[0] > MAX_GRID_HEADS:
        return None
    grids = [_grid(h, weights[h], block.data.get("tokens"), lang) for h in range(weights.shape[0])]
    colon = "：" if lang == "zh" else ": "
    legend = Text(f"{block.data['label']}{colon} 0 '{SHADES[0] * 2}' … 1 '{SHADES[-1] * 2}'", style="dim")
    return Padding(Group(legend, Columns(grids, padding=(0, 3))), (0, 0, 0, 2))


DRAW = {"heading": _heading, "text": _text, "code": _code, "tensor": _tensor, "table": _table,
        "check": _check, "figure": _figure}


def render(story: Story, console: Console) -> None:
    """Print every block of the story, in order, with a blank line before each heading."""
    for block in story.blocks:
        drawn = DRAW[block.kind](block, story.lang)
        if drawn is None:
            continue
        if block.kind == "heading":
            console.print()
        console.print(drawn)


def render_summary(stories: list[Story], console: Console, lang: str) -> None:
    """One closing line: all checks passed, or which ones failed."""
    total = sum(len(s.checks) for s in stories)
    failed = [claim for s in stories for claim in s.failed_checks]
    console.print()
    if not failed:
        console.print(Text(ui("summary_ok", lang, n=total), style="bold green"))
        return
    console.print(Text(ui("summary_failed", lang, k=len(failed), n=total), style="bold red"))
    for claim in failed:
        console.print(Padding(Wrapped(Text(f"✗ {claim}", style="red")), (0, 0, 0, 2)))
