"""scripts/record_latest.py (what `make test-latest` runs last) and the record it keeps, docs/releases.json,
which docs/releases.md quotes."""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("record_latest", ROOT / "scripts" / "record_latest.py")
record_latest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(record_latest)

JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="5">
<testcase classname="tests.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.test_a" name="test_ok_too" time="0.1"><system-out>noise</system-out></testcase>
<testcase classname="tests.test_a" name="test_broken[llama4-none]" time="0.1"><failure message="x">x</failure></testcase>
<testcase classname="tests.test_b" name="test_setup" time="0.1"><error message="y">y</error></testcase>
<testcase classname="tests.test_b" name="test_skipped" time="0.0"><skipped message="z">z</skipped></testcase>
</testsuite></testsuites>"""


def test_counts_reads_each_outcome_and_names_what_did_not_pass(tmp_path):
    results = tmp_path / "results.xml"
    results.write_text(JUNIT)
    assert record_latest.counts(results) == {
        "passed": 2, "failed": 1, "errors": 1, "skipped": 1,
        "not_passed": ["tests.test_a::test_broken[llama4-none]", "tests.test_b::test_setup"]}


def test_a_rerun_of_the_same_release_and_command_replaces_its_entry_and_others_stay(tmp_path):
    results, record_file = tmp_path / "results.xml", tmp_path / "releases.json"
    results.write_text(JUNIT)
    first = record_latest.record(results, record_file, "make test-latest", today="2026-01-01")
    record_latest.record(results, record_file, "make test-latest PYTEST_ARGS='tests/test_x.py'", today="2026-01-02")
    again = record_latest.record(results, record_file, "make test-latest", today="2026-01-03")
    runs = json.loads(record_file.read_text())["runs"]
    assert [run["date"] for run in runs] == ["2026-01-03", "2026-01-02"]
    assert first["versions"] == again["versions"] and set(first["versions"]) == set(record_latest.PACKAGES)
    assert runs[0]["versions"]["torch"] is not None and runs[0]["passed"] == 2
    assert record_latest.summary(again) == (
        f"transformers {again['versions']['transformers']}, on 2026-01-03: 2 passed, 1 failed, 1 errors, 1 skipped\n"
        "command: make test-latest")


def test_the_docs_quote_the_newest_recorded_run():
    runs = json.loads((ROOT / "docs" / "releases.json").read_text())["runs"]
    newest = runs[0]
    text = (ROOT / "docs" / "releases.md").read_text()
    assert f"```text\n{record_latest.summary(newest)}\n```" in text  # as the script printed it
    pinned = re.search(r"^transformers==(\S+)$", (ROOT / "constraints.txt").read_text(), flags=re.M).group(1)
    assert pinned in text
