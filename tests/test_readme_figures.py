"""Every benchmark figure the READMEs quote comes from the committed run, benchmarks/results.json.

A figure is a number with a unit: 1.23x (or ×), 4.5 ms, 13 us, 618 MiB, 4.1 GiB, 26 GB/s, 290 GFLOP/s,
2 TFLOP/s, 27%. Each one quoted in benchmarks/README.md, and in every paragraph of README.md that
links to it, must equal a value of the same kind in results.json (a table cell, a target's value or
goal, or a figure inside a note), rounded as the quote rounds it. Code (fenced or inline) is not prose
and is skipped. The Targets table and the machine description are checked against results.json too.
"""
from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

import pytest

from multihead.bench.report import target_cells
from multihead.bench.results import Target

ROOT = Path(__file__).resolve().parents[1]
RESULTS = json.loads((ROOT / "benchmarks/results.json").read_text())
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(x|×|ms|us|µs|MiB|GiB|GB/s|GFLOP/s|TFLOP/s|%)(?![\w])")
SAME_UNIT = {"×": "x", "µs": "us"}
RATIO_RANGE = re.compile(r"ratios (\d+\.\d+) to (\d+\.\d+)")


def unit_of(column: str, row: dict) -> str | None:
    """The unit a table column's numbers are quoted in, or None for counts and settings."""
    if column == "rate":
        return row.get("unit") or None
    if column.endswith("ms"):
        return "ms"
    if column == "us":
        return "us"
    if "MiB" in column:
        return "MiB"
    if column == "% of GEMM":
        return "%"
    if column.startswith("x ") or " x " in column or " / " in column or column == "ideal":
        return "x"
    return None


def figures_in(text: str) -> list[tuple[str, str]]:
    """[(number as written, unit)] for every figure in `text`."""
    return [(num, SAME_UNIT.get(unit, unit)) for num, unit in FIGURE.findall(text)]


GPU_RESULTS = json.loads((ROOT / "benchmarks" / "gpu-results.json").read_text())


@cache
def measured() -> dict[str, list[float]]:
    """{unit: every value of that kind in results.json}."""
    pool: dict[str, list[float]] = {}

    def add(unit, value):
        pool.setdefault(unit, []).append(float(value))
        if unit == "GFLOP/s":
            pool.setdefault("TFLOP/s", []).append(float(value) / 1000)

    for suite in RESULTS["suites"].values():
        texts = [suite["title"], *suite["notes"]]
        for row in suite["rows"]:
            for column, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    unit = unit_of(column, row)
                    if unit:
                        add(unit, value)
                elif isinstance(value, str):
                    texts.append(value)
        for t in suite["targets"]:
            unit = "MiB" if "MiB" in t["name"] else "%" if "share" in t["name"] else "x"
            for value in (t["value"], t["goal"]):
                if value is not None:
                    add(unit, value * 100 if unit == "%" else value)
            texts.append(t["note"])
        for text in texts:
            for num, unit in figures_in(text):
                add(unit, num)
            for lo, hi in RATIO_RANGE.findall(text):  # "per-round ratios 0.98 to 1.05"
                add("x", lo)
                add("x", hi)
    for rows in GPU_RESULTS.values():  # the GPU run: TFLOP/s, ms and ratios, quoted in the GPU section
        for row in rows if isinstance(rows, list) else ():
            for column, value in row.items():
                if isinstance(value, float):
                    add("TFLOP/s" if "tflops" in column else "ms" if column.endswith("ms") else "x", value)
    return pool


def prose(markdown: str) -> str:
    """The text without fenced code blocks, inline code and link targets."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def quoting_text(doc: str) -> str:
    """benchmarks/README.md whole; in README.md, the paragraphs that link to benchmarks/README.md."""
    text = (ROOT / doc).read_text()
    if doc == "benchmarks/README.md":
        return prose(text)
    return "\n\n".join(p for p in prose_paragraphs(text) if "benchmarks/README.md" in p)


def prose_paragraphs(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", "", text, flags=re.DOTALL | re.MULTILINE)
    return [re.sub(r"`[^`]*`", "", p) for p in text.split("\n\n")]


def matches(number: str, values: list[float]) -> bool:
    decimals = len(number.split(".")[1]) if "." in number else 0
    return any(abs(v - float(number)) <= 0.5 * 10**-decimals + 1e-9 for v in values)


QUOTES = [pytest.param(doc, num, unit, id=f"{doc}:{num}{unit}")
          for doc in ("README.md", "benchmarks/README.md")
          for num, unit in dict.fromkeys(figures_in(quoting_text(doc)))]


def test_the_readmes_quote_figures():
    assert {doc for doc, *_ in (q.values for q in QUOTES)} == {"README.md", "benchmarks/README.md"}


@pytest.mark.parametrize(("doc", "number", "unit"), QUOTES)
def test_every_quoted_figure_is_in_the_results(doc, number, unit):
    assert matches(number, measured().get(unit, [])), (
        f"{doc} quotes {number}{unit}, which benchmarks/results.json does not contain")


def test_the_targets_table_is_the_one_the_run_wrote():
    text = (ROOT / "benchmarks/README.md").read_text()
    targets = [Target(t["name"], t["value"], t["op"], t["goal"], t["note"])
               for suite in RESULTS["suites"].values() for t in suite["targets"]]
    rows = ["| " + " | ".join(target_cells(t)) + " |" for t in targets]
    table = "\n".join(["| target | value | goal | verdict | note |", "|---|---|---|---|---|", *rows])
    assert table in text


def test_the_run_section_names_the_machine_of_the_results():
    text = (ROOT / "benchmarks/README.md").read_text()
    run = text.split("## The run", 1)[1].split("\n## ", 1)[0]
    m = RESULTS["machine"]
    for value in (m["cpu"], f"{m['cores']} cores", f"{m['threads']} torch thread", m["torch"], m["python"],
                  m["date"], str(m["load_average_at_start"]), str(m["load_average"])):
        assert value in run, f"the run section does not say {value!r}"


def test_the_tables_are_the_ones_the_run_wrote():
    text = (ROOT / "benchmarks/README.md").read_text()
    written = (ROOT / "benchmarks/results.md").read_text()
    tables = [t for t in written.split("### ")[1:] if not t.startswith("Targets")]
    assert tables and all("### " + t.strip() in text for t in tables)
