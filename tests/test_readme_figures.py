"""Every benchmark figure the docs quote is tied to the one place in the committed results it comes from.

A figure is a number with a unit: 1.23x (or ×), 4.5 ms, 13 us, 618 MiB, 4.1 GiB, 26 GB/s, 290 GFLOP/s,
2 TFLOP/s, 27%. tests/readme_figures.json maps each distinct figure of each doc (README.md,
benchmarks/*.md except the run's own tables, docs/*.md) to a key (tests/figure_keys.py): a target's
value, a table cell, or a figure inside a note, in benchmarks/*.json. The figure must equal that value
rounded as the quote rounds it. A figure with no entry fails: add its key (or `none: <why>` for a
number that is no measurement). Code (fenced or inline) and link targets are not prose and are skipped.
The Targets table and the machine description are checked against results.json too.
"""
from __future__ import annotations

import json
import re

import pytest
from figure_keys import ROOT, figures_in, matches, numbers_at, results

from multihead.bench.report import target_cells
from multihead.bench.results import Target

RESULTS = results("results.json")
FIGURE_MAP = json.loads((ROOT / "tests" / "readme_figures.json").read_text())


def prose(markdown: str) -> str:
    """The text without fenced code blocks, inline code and link targets."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.DOTALL | re.MULTILINE)
    text = re.sub(r"`[^`]*`", "", text)
    return re.sub(r"\]\([^)]*\)", "]", text)


def quoting_docs() -> list[str]:
    """The docs whose figures must be tied: README.md, benchmarks/*.md but the runs' tables, docs/*.md."""
    bench = [p for p in sorted((ROOT / "benchmarks").glob("*.md"))
             if not (p.name == "results.md" or p.name.endswith("-results.md"))]
    docs = sorted((ROOT / "docs").glob("*.md"))
    return ["README.md"] + [str(p.relative_to(ROOT)) for p in bench + docs]


def quoted(doc: str) -> list[str]:
    """The distinct figures of `doc`, as written (unit normalised), in order of first appearance."""
    return list(dict.fromkeys(num + unit for num, unit in figures_in(prose((ROOT / doc).read_text()))))


QUOTES = [pytest.param(doc, figure, id=f"{doc}:{figure}") for doc in quoting_docs() for figure in quoted(doc)]


def test_the_docs_quote_figures_and_the_map_has_no_stale_entries():
    assert {"README.md", "benchmarks/README.md", "benchmarks/decode.md"} <= {q.values[0] for q in QUOTES}
    for doc, entries in FIGURE_MAP.items():
        stale = set(entries) - set(quoted(doc))
        assert not stale, f"tests/readme_figures.json maps figures {doc} no longer quotes: {sorted(stale)}"


@pytest.mark.parametrize(("doc", "figure"), QUOTES)
def test_every_quoted_figure_equals_the_result_it_is_tied_to(doc, figure):
    key = FIGURE_MAP.get(doc, {}).get(figure)
    assert key, f"{doc} quotes {figure}: tie it to its key in tests/readme_figures.json"
    if key.startswith("none: "):
        return
    number, unit = figures_in(figure)[0]
    values = numbers_at(key, unit)
    assert matches(number, values), f"{doc} quotes {figure}, but {key} holds {values}"


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
