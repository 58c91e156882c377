"""Tables (rich on the terminal, Markdown for benchmarks/README.md), the one-line JSON, and what the
machine's load means for the numbers."""
from __future__ import annotations

import json
import shutil

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


PIPED_WIDTH = 100   # columns of the tables when stdout is not a terminal (a file, a pipe, CI logs)
MAX_WIDTH = 200     # never wider, even on a very wide terminal
BUSY_SHARE = 0.5    # other work taking more than half the cores makes wall-clock times unreliable


def table_width(is_terminal: bool) -> int:
    """The width the tables are drawn to: the terminal's (at most MAX_WIDTH), PIPED_WIDTH when piped."""
    if not is_terminal:
        return PIPED_WIDTH
    return min(shutil.get_terminal_size((PIPED_WIDTH, 24)).columns, MAX_WIDTH)


def busy_share(machine: dict) -> float | None:
    """How much of the machine other work took while the bench ran, as a share of its cores: the 1-minute
    load average at the start (before the bench added its own), or at the end minus the bench's own
    threads, whichever is larger. None where the OS has no load average."""
    start, end = machine.get("load_average_at_start"), machine.get("load_average")
    cores = machine.get("cores") or 1
    if start is None and end is None:
        return None
    others = [start[0]] if start else []
    if end:
        others.append(end[0] - machine.get("threads", 1))
    return max(others) / cores


def load_note(machine: dict) -> str | None:
    """What the load means for the numbers, when other work took more than BUSY_SHARE of the cores."""
    share = busy_share(machine)
    if share is None or share <= BUSY_SHARE:
        return None
    start = machine.get("load_average_at_start") or machine.get("load_average")
    cores = machine.get("cores")
    taken = (f"other work wanted {share:.1f} times as many cores as it has ({cores})" if share >= 1
             else f"other work kept about {share:.0%} of its {cores} cores occupied")
    note = f"The machine was busy: {taken} (1-minute load average {start[0]} at the start). "
    if machine.get("clock", "wall") == "wall":
        return note + ("Wall-clock times then include waiting for a core, so the ratios wobble and a target can "
                       "read MISSED for that reason alone. For steadier numbers rerun with --threads 1 --clock cpu "
                       "(counts only this process's CPU time), or on an idle machine.")
    return note + ("The CPU clock already leaves out the time spent waiting for a core, but shared caches and "
                   "memory bandwidth still slow the work: read close MISSED targets with care, or rerun on an idle "
                   "machine.")


def print_rich(results: list[SuiteResult], machine: dict, console=None) -> None:
    """Every suite's table, then the targets and what the load means, on stdout (or `console`): as wide as
    the terminal (at most MAX_WIDTH columns), PIPED_WIDTH when piped."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    if console is None:
        console = Console()
        console = Console(width=table_width(console.is_terminal))
    isa = f"{machine.get('cpu_flags') or 'ISA flags unknown'}; decode kernel: {machine.get('decode_isa') or 'not loaded'}"
    console.print(f"[bold]multihead bench[/] on {machine['cpu']} ({isa}; {machine['threads']} threads, "
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
    note = load_note(machine)
    if note:
        console.print(f"[yellow]{escape(note)}[/]")


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
