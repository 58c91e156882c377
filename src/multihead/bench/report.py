"""Tables (rich on the terminal, Markdown for benchmarks/README.md) and the one-line JSON."""
from __future__ import annotations

import json

from multihead.bench.results import SuiteResult, Target


def cell(column: str, value) -> str:
    """One value as the tables show it: ratios as 1.23x, times and rates with 3-4 significant digits."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if column.startswith("x ") or " x " in column or " / " in column or column == "ideal":
            return f"{value:.2f}x"
        if "diff" in column:
            return f"{value:.1e}"
        return f"{value:.4g}" if abs(value) < 1e4 else f"{value:.0f}"
    return str(value)


def target_cells(t: Target) -> list[str]:
    """[name, value, goal, verdict, note]."""
    value = "-" if t.value is None else f"{t.value:.3g}"
    verdict = {True: "met", False: "MISSED", None: "not measured"}[t.met]
    return [t.name, value, f"{t.op} {t.goal:g}", verdict, t.note]


def print_rich(results: list[SuiteResult], machine: dict) -> None:
    """Every suite's table, then the targets, on stdout."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if not console.is_terminal:  # piped: wide enough that no column is cut
        console = Console(width=200)
    console.print(f"[bold]multihead bench[/] on {machine['cpu']} ({machine['threads']} threads, "
                  f"{machine.get('clock', 'wall')} clock), "
                  f"torch {machine['torch']}, {machine['date']}, load average "
                  f"{machine.get('load_average_at_start')} at the start, {machine['load_average']} at the end")
    for r in results:
        table = Table(title=r.title, title_justify="left")
        for c in r.columns:
            table.add_column(c, justify="left" if c in ("implementation", "note", "measurement") else "right")
        for row in r.rows:
            table.add_row(*(escape(cell(c, row.get(c))) for c in r.columns))  # "ours[sdpa]" is text
        console.print(table)
        for note in r.notes:
            console.print(f"  {note}")
    targets = [t for r in results for t in r.targets]
    if targets:
        table = Table(title="Targets", title_justify="left")
        for c in ("target", "value", "goal", "verdict", "note"):
            table.add_column(c)
        for t in targets:
            table.add_row(*map(escape, target_cells(t)), style=None if t.met is not False else "red")
        console.print(table)


def markdown(results: list[SuiteResult]) -> str:
    """The same tables as Markdown."""
    out = []
    for r in results:
        out += [f"### {r.title}", "", "| " + " | ".join(r.columns) + " |",
                "|" + "---|" * len(r.columns)]
        out += ["| " + " | ".join(cell(c, row.get(c)) for c in r.columns) + " |" for row in r.rows]
        out += [""] + [f"- {n}" for n in r.notes] + ([""] if r.notes else [])
    targets = [t for r in results for t in r.targets]
    if targets:
        out += ["### Targets", "", "| target | value | goal | verdict | note |", "|---|---|---|---|---|"]
        out += ["| " + " | ".join(target_cells(t)) + " |" for t in targets]
    return "\n".join(out) + "\n"


def json_line(results: list[SuiteResult], machine: dict) -> str:
    """One line: {"machine": ..., "suites": {name: ...}}."""
    return json.dumps({"machine": machine, "suites": {r.suite: r.to_json() for r in results}},
                      separators=(",", ":"))
