"""Every number in README.md, benchmarks/*.md and docs/*.md is tied, each occurrence on its own, to the
committed result it comes from, or declared as no measured figure (tests/figure_docs.py says how); the
runs' own tables are what the report renders from their JSON. A doc edit that adds a number without an
entry fails here with the file, the line, the number and what to add.
"""
from __future__ import annotations

import importlib.util
import json

import pytest
from figure_docs import (
    DECLARED,
    HARNESS_TABLES,
    MAP_PATH,
    RUN_TABLES,
    carry_over,
    figure_map,
    numbers_in,
    problems,
    quoting_docs,
    render,
)
from figure_keys import ROOT, Results, figure_after, matches, tokens

from multihead.bench.report import target_cells
from multihead.bench.results import Target

RESULTS = Results()


@pytest.mark.parametrize("doc", quoting_docs())
def test_every_number_in_the_doc_is_tied_or_declared(doc):
    found = problems(doc, (ROOT / doc).read_text(), figure_map().get(doc, {}), RESULTS)
    assert not found, f"{len(found)} problem(s) in {doc}:\n" + "\n".join(found)


def test_the_map_names_only_quoting_docs_and_the_docs_quote_measured_figures():
    assert set(figure_map()) <= set(quoting_docs()), "tests/readme_figures.json names a doc the test does not read"
    tied = [e for doc in ("README.md", "benchmarks/README.md", "benchmarks/decode.md", "benchmarks/latent.md")
            for entry in figure_map()[doc].values() for e in (entry if isinstance(entry, list) else [entry]) if "#" in e]
    assert len(tied) > 100


@pytest.mark.parametrize(("table", "source"), RUN_TABLES.items())
def test_the_run_tables_are_what_the_report_renders_from_their_results(table, source):
    assert (ROOT / "benchmarks" / table).read_text() == render(RESULTS, source), (
        f"benchmarks/{table} is not what `multihead bench --markdown` writes from benchmarks/{source}: "
        "rerun the bench (or write the table from the JSON)")


@pytest.mark.parametrize(("table", "source"), HARNESS_TABLES.items())
def test_the_harness_tables_are_what_their_harness_makes_of_their_results(table, source):
    data_file, script = source
    spec = importlib.util.spec_from_file_location(script.removesuffix(".py"), ROOT / "benchmarks" / script)
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    data = json.loads((ROOT / "benchmarks" / data_file).read_text(encoding="utf-8"))
    assert (ROOT / "benchmarks" / table).read_text(encoding="utf-8") == harness.markdown(data) + "\n", (
        f"benchmarks/{table} is not what benchmarks/{script} writes from benchmarks/{data_file}: rerun it")


def test_a_line_without_an_entry_names_the_file_line_number_and_what_to_add():
    text = "# Title\n\nThe absorbed step takes 5.24 ms, 42.1x faster.\n"
    [message] = problems("benchmarks/latent.md", text, {}, RESULTS)
    assert message.startswith("benchmarks/latent.md:3 holds 2 number(s) with no entry")
    assert "The absorbed step takes 5.24 ms, 42.1x faster." in message and "a list of 2 entries" in message
    assert "latent.json#latent|row|decode step N=4096 fp32 | ours: absorbed (MLA + LatentCache)|ms" in message


def test_each_occurrence_is_checked_against_its_own_key():
    """The same figure written twice on a line, tied to two rows: the row whose value differs fails."""
    runs = "decode, " + RESULTS.data["decode.json"]["machine"]["decode_isa"] + " build"
    keys = [f"decode.json#decode|row|decode N={n} fp32: attention | ours: mh.attention | {runs}|% of bandwidth"
            for n in (4096, 1024)]
    first, second = (RESULTS.values(key, "%")[0] for key in keys)
    assert round(first) != round(second)
    line = f"| ours | {first:.0f}% / {first:.0f}% |"
    [message] = problems("benchmarks/decode.md", line, {line: keys}, RESULTS)
    assert message.startswith(f"benchmarks/decode.md:1: {first:.0f}% (number 2 of 2 on the line)")
    assert f"{second:.1f}"[:3] in message


def test_a_declaration_must_be_a_known_kind_and_a_measured_figure_cannot_be_declared():
    line = "took 14 minutes and 3 s"
    assert problems("README.md", line, {line: ["count", "shape: a size"]}, RESULTS) == []
    bad = problems("README.md", line, {line: ["nonsense", "unrecorded: an A/B run outside the suite"]}, RESULTS)
    assert "neither a key nor a declared kind" in bad[0] and "no committed result cannot stay" in bad[1]
    assert set(DECLARED) >= {"shape", "setting", "goal", "version", "count", "id"} and "unrecorded" not in DECLARED


def test_no_doc_declares_a_measured_figure():
    """The map holds keys and declarations only: no entry says a figure was measured outside a committed run."""
    entries = [e for doc in figure_map().values() for entry in doc.values()
               for e in (entry if isinstance(entry, list) else [entry])]
    assert not [e for e in entries if e.partition(":")[0] == "unrecorded"]


def test_a_stale_line_and_a_wrong_count_of_entries_are_reported():
    found = problems("README.md", "now 3 and 4\n", {"now 3 and 4": ["math"], "gone 5": "math"}, RESULTS)
    assert found[0].endswith("the line has 2 numbers but 1 entries") and "no longer has" in found[1]


def test_a_note_label_ties_one_figure_of_the_note_never_any():
    note = "8 MiB per step; raw SDPA 17%, grouped queries 27%, bandwidth 39.5 GB/s"
    assert figure_after(note, "grouped queries", "k") == [27.0] and figure_after(note, "^", "k") == [8.0]
    with pytest.raises(KeyError, match="occurs 0 times"):
        figure_after(note, "plain torch", "k")
    with pytest.raises(KeyError, match="occurs 2 times"):
        figure_after(note + "; grouped queries 30%", "grouped queries", "k")


def test_numbers_are_read_as_written_with_their_units():
    found = [(m["number"] or m["date"] or m["version"], (m["unit"] or "").strip()) for m in
             tokens("fp32 H100 at 1.85× and 4.1 GiB, 10,000 runs, 4.8e-7, 8 x 512..4096, 2.13.0+cpu on 2026-11-26 01:22")]
    assert found == [("1.85", "×"), ("4.1", "GiB"), ("10,000", ""), ("4.8e-7", ""), ("8", ""), ("512", ""),
                     ("4096", ""), ("2.13.0+cpu", ""), ("2026-11-26 01:22", "")]
    assert matches("60", [59.51]) and not matches("60", [51.7]) and matches("1.87e+03", [1868.9])
    assert matches("2026-11-26 01:22", ["2026-11-26 01:22 UTC"]) and not matches("2.13.0", [2.13])


def test_code_and_link_targets_are_not_prose():
    text = "see `run(4096)` and [the run](decode.md#n-4096), 5 keys\n```\nx = 17\n```\n"
    assert [(n.line, n.written) for n in numbers_in("README.md", text)] == [(1, "5")]


def test_the_targets_table_is_the_one_the_run_wrote():
    text = (ROOT / "benchmarks/README.md").read_text()
    targets = [Target(t["name"], t["value"], t["op"], t["goal"], t["note"])
               for suite in RESULTS.data["results.json"]["suites"].values() for t in suite["targets"]]
    rows = ["| " + " | ".join(target_cells(t)) + " |" for t in targets]
    table = "\n".join(["| target | value | goal | verdict | note |", "|---|---|---|---|---|", *rows])
    assert table in text


@pytest.mark.parametrize(("doc", "source"), [("benchmarks/README.md", "results.json"), ("benchmarks/decode.md", "decode.json"),
                                             ("benchmarks/latent.md", "latent.json")])
def test_each_run_section_names_the_machine_and_the_isa_that_gave_its_figures(doc, source):
    run = (ROOT / doc).read_text().split("## The run", 1)[1].split("\n## ", 1)[0]
    machine = RESULTS.data[source]["machine"]
    said = [machine["cpu"], machine["cpu_capability"]] + (
        [machine["decode_isa"]] if machine.get("decode_isa") else [])
    for value in said:
        assert value in run, f"{doc}'s run section does not say {value!r} (benchmarks/{source}'s machine)"


@pytest.mark.parametrize("file", sorted(p.name for p in (ROOT / "benchmarks").glob("*.json")))
def test_each_results_file_records_the_isa_or_says_why_it_cannot(file):
    """A bench's machine entry: the CPU's vector flags, or an isa_note saying what the run recorded instead;
    a held-out zoo run's conditions: its cpu (with its flags), or that the run did not record it."""
    data = json.loads((ROOT / "benchmarks" / file).read_text(encoding="utf-8"))
    if "conditions" in data:
        assert data["conditions"].get("cpu"), f"benchmarks/{file}'s conditions say nothing of the CPU"
        return
    machine = data["machine"]
    assert machine.get("cpu_capability"), f"benchmarks/{file} records no cpu_capability"
    assert machine.get("cpu_flags") or machine.get("isa_note"), (
        f"benchmarks/{file} records neither the CPU's vector flags (cpu_flags) nor why not (isa_note)")


def test_the_tables_are_the_ones_the_run_wrote():
    text = (ROOT / "benchmarks/README.md").read_text()
    written = (ROOT / "benchmarks/results.md").read_text()
    tables = [t for t in written.split("### ")[1:] if not t.startswith("Targets")]
    assert tables and all("### " + t.strip() in text for t in tables)


def test_a_reworded_line_keeps_its_entry_and_a_changed_number_does_not():
    entries = {"it took 5.24 ms": ["k1"], "at 3 heads": ["shape"], "other 7": ["math"]}
    moved = carry_over(entries, "README.md", "it took 5.24 ms now\nat 4 heads\nother 7\n")
    assert moved == ["it took 5.24 ms now"] and list(entries) == ["it took 5.24 ms now", "other 7", "at 3 heads"]
    assert entries["it took 5.24 ms now"] == ["k1"]


def test_the_map_file_is_sorted_json_with_one_entry_per_line_text():
    raw = json.loads(MAP_PATH.read_text())
    for doc, entries in raw.items():
        lines = [n.text for n in numbers_in(doc, (ROOT / doc).read_text())]
        assert list(entries) == sorted(entries, key=lines.index), f"{doc}'s entries are not in the doc's order"
