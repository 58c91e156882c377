"""The figure test catches a changed quote and a changed result (tests/figure_mutations.py runs every
mutation; here the issue's own examples and an even sample of all ties, both sides)."""
from __future__ import annotations

from figure_docs import figure_map, problems, render
from figure_keys import ROOT, Results
from figure_mutations import other_number, other_value, run

SHARE = "decode N=4096 fp32: attention reads K/V at this share of the read bandwidth"
MLA_ROW = "| ours, absorbed | 5.24 | 1.00 | 3.69 | 1.00 |"  # benchmarks/latent.md's table


def line_of(doc: str, line: str) -> int:
    return (ROOT / doc).read_text().split("\n").index(line) + 1


def test_a_share_changed_in_decode_json_fails_where_the_docs_quote_it():
    results = Results().changed()
    target = next(t for t in results.suites("decode.json")["decode"]["targets"] if t["name"] == SHARE)
    target["value"] = 0.55
    found = problems("benchmarks/decode.md", (ROOT / "benchmarks/decode.md").read_text(),
                     figure_map()["benchmarks/decode.md"], results)
    assert any(SHARE in p and "[55.00000000000001]" in p for p in found), found  # the prose quote
    assert any("not one the report renders" in p for p in found)  # the Targets table copied from the run


def test_the_absorbed_step_changed_in_latent_json_fails_the_mla_table():
    results = Results().changed()
    row = results.suites("latent.json")["latent"]["rows"][0]
    assert row["implementation"].startswith("ours: absorbed") and row["ms"] > 5
    row["ms"] = 2.0
    found = problems("benchmarks/latent.md", (ROOT / "benchmarks/latent.md").read_text(),
                     figure_map()["benchmarks/latent.md"], results)
    assert any(p.startswith(f"benchmarks/latent.md:{line_of('benchmarks/latent.md', MLA_ROW)}: 5.24") for p in found), found
    assert render(results, "latent.json") != (ROOT / "benchmarks/latent-results.md").read_text()


def test_a_quote_changed_in_a_doc_fails_even_with_its_entry_carried_over():
    doc = "benchmarks/latent.md"
    text = (ROOT / doc).read_text()
    entries = {**figure_map()[doc], MLA_ROW.replace("5.24", "2.00"): figure_map()[doc][MLA_ROW]}
    found = problems(doc, text.replace(MLA_ROW, MLA_ROW.replace("5.24", "2.00")), entries, Results())
    assert found and found[0].startswith(f"benchmarks/latent.md:{line_of(doc, MLA_ROW)}: 2.00 (number 1 of 4 on the line)")


def test_an_even_sample_of_every_tie_is_caught_on_both_sides():
    found = run(every=29)
    assert found["doc side"] >= 20 and found["result side"] >= 20 and found["declared"] > 0
    assert found["escaped"] == []


def test_a_mutation_changes_the_figure_and_keeps_how_it_is_written():
    assert other_number("5.24") == "8.86" and other_number("60") == "91" and other_number("10,000") == "15,001"
    assert other_number("6.4e-08") == "10.6e-08" and other_number("2026-11-26 01:22") == "2027-11-26 01:22"
    assert other_number("2.13.0+cpu") == "2.13.1+cpu"
    assert other_value(4096) == 8193 and other_value(0.5) == 1.75 and other_value("load 0.6 at start") == "load 1.9 at start"
