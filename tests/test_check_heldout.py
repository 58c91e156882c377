"""The held-out zoo of `multihead check` (benchmarks/check_heldout/) and its harness.

The zoo's figures are reported in benchmarks/check_heldout-*.md, never asserted here: what is tested is
that every case is what its manifest says (verified against a float64 reference, without the checker),
that the harness reads verdicts right, and that it runs end to end on two cases.
"""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from multihead.bench.machine import cpu_model

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


harness = _load("check_heldout_harness", BENCHMARKS / "check_heldout.py")
verify = _load("check_heldout_verify", BENCHMARKS / "check_heldout" / "verify.py")
zoo_files = sys.modules["zoo_files"]  # imported by both, from the zoo's folder

IDS = {"mask-sign-flipped", "scale-halved", "causal-off-by-one"}


def test_every_case_is_what_its_manifest_says(tmp_path, one_thread):
    """Correct cases equal the float64 reference; buggy ones differ, and equal it once their fix is applied."""
    cases = verify.load_manifest()
    assert len(cases) >= 60 and len({c["name"] for c in cases}) == len(cases)
    failures = [(case["name"], notes) for case in cases for ok, notes in [verify.verify(case, tmp_path)] if not ok]
    assert not failures


def test_manifest_records_what_the_readme_promises():
    cases = verify.load_manifest()
    for case in cases:
        assert {"name", "file", "target", "idiom", "source", "expected", "lang", "adapter"} <= set(case), case["name"]
        assert case["lang"] in ("EN", "ZH"), case["name"]
        assert case["expected"] == "PASS" or case.get("fix"), case["name"]
    stored = {case.get("mutant_of", case["file"]) for case in cases}
    on_disk = {path.name for path in zoo_files.CASES.glob("*.py")}
    assert on_disk == stored == {case["file"] for case in cases if "mutant_of" not in case}
    correct = {case["file"] for case in cases if case["expected"] == "PASS"}
    assert {case["mutant_of"] for case in cases if "mutant_of" in case} <= correct


def test_a_mutant_is_its_correct_sibling_with_the_fix_undone(tmp_path):
    """The learner's file is rebuilt from the sibling; applying the fix gives the sibling back, byte for byte."""
    mutants = [case for case in verify.load_manifest() if "mutant_of" in case]
    assert len(mutants) >= 30
    folder = zoo_files.write_cases(mutants, tmp_path)
    for case in mutants:
        written = (folder / case["file"]).read_text(encoding="utf-8")
        sibling = (zoo_files.CASES / case["mutant_of"]).read_text(encoding="utf-8")
        assert written != sibling and zoo_files.fixed_source(case) == sibling, case["name"]
    broken = {**mutants[0], "fix": [["text that is nowhere", "also nowhere"]]}
    with pytest.raises(ValueError, match="occurs 0 times, expected once"):
        zoo_files.case_source(broken)


@pytest.mark.parametrize("returncode, output, expected", [
    (0, "╭─ PASS ─╮\n│ PASS: a.py:A matches", "PASS"),
    (1, "╭─ FAIL: mask added with the wrong sign (mask-sign-flipped) ─╮\n│ FAIL: a.py:A", "mask-sign-flipped"),
    (1, "╭─ 未通过：掩码加到分数上时符号反了（mask-sign-flipped） ─╮", "mask-sign-flipped"),
    (1, "╭─ FAIL ─╮\n│ FAIL: a.py:A: unknown difference\n│ (max error 1e-1)\n│ at this head count (scale-halved)",
     "FAIL"),
    (1, "╭─ FAIL: something (not-a-catalogue-id) ─╮", "FAIL"),
    (2, "╭─ ERROR ─╮", "ERROR"),
    (None, "", "TIMEOUT"),
])
def test_verdict_reads_the_report_head(returncode, output, expected):
    assert harness.verdict(returncode, output, IDS) == expected


@pytest.mark.parametrize("expected, got, ok", [
    ("PASS", "PASS", True), ("PASS", "FAIL", False), ("scale-halved", "scale-halved", True),
    ("scale-halved", "wrong-scale", False), ("FAIL", "wrong-scale", True), ("FAIL", "FAIL", True),
    ("FAIL", "PASS", False), ("FAIL", "ERROR", False),
])
def test_right_counts_any_fail_for_mistakes_without_an_id(expected, got, ok):
    assert harness.right(expected, got) is ok


def test_command_passes_the_learners_hints_and_the_claim_only_when_asked():
    case = {"file": "f.py", "target": "A", "init": '{"d": 1}', "call": "causal=yes", "claim": "keep"}
    args = harness.command(case, "zh", with_claim=False, folder=Path("/learner"))
    assert args == ["/learner/f.py:A", "--init", '{"d": 1}', "--call", "causal=yes", "--lang", "zh"]
    assert harness.command(case, "en", with_claim=True, folder=Path("/learner"))[4] == "causal=yes,mask=keep"


@pytest.mark.slow
def test_harness_runs_two_cases_and_writes_markdown_and_json(tmp_path):
    markdown, json_file = tmp_path / "heldout.md", tmp_path / "heldout.json"
    harness.main(["--cases", "zh_blog_1", "zh_blog_6", "--lang", "en", "--markdown", str(markdown),
                  "--json", str(json_file)])
    data = json.loads(json_file.read_text(encoding="utf-8"))
    assert [row["case"] for row in data["rows"]] == ["zh_blog_1", "zh_blog_6"]
    for row in data["rows"]:
        assert row["en"]["got"] in {"PASS", "FAIL", "ERROR", "TIMEOUT"} | harness.known_bug_ids()
        assert row["en"]["seconds"] > 0 and row["en"]["cpu_seconds"] > 0
    assert set(data["totals"]["en"]) >= {"correct PASS", "bug ids right", "false PASS", "exit 2", "p95 s per check",
                                           "p95 CPU s per check"}
    assert data["conditions"]["cpu"].startswith(cpu_model())  # the machine, its vector flags in brackets
    text = markdown.read_text(encoding="utf-8")
    assert "| zh_blog_1 |" in text and "| zh_blog_6 |" in text
