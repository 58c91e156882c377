"""`multihead check` against its goal metrics on the zoo (tests/check_zoo), its buggy modules and its mutants.

Every correct module must PASS, at least 95% of the mutants must get the right bug id, no mutant may
PASS, at most one check may fail to run (exit 2), and one check takes at most 2 s on this machine.

    python benchmarks/check_zoo.py [--json benchmarks/check_zoo.json] [--markdown benchmarks/check_zoo-results.md]

prints every check and the goal metrics; the JSON (the machine, one row per check, the targets) is what
docs/check.md quotes, and check_zoo-results.md is the bench report's table rendered from it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from zoo_mutants import BUGGY, BUGGY_OPTIONS, CORRECT, MUTANTS, target_path, write_mutant  # noqa: E402

from multihead.bench.machine import describe  # noqa: E402
from multihead.bench.report import json_line, markdown  # noqa: E402
from multihead.bench.results import SuiteResult, Target  # noqa: E402
from multihead.checker import check  # noqa: E402


def _timed(target: str, options: dict):
    start = time.perf_counter()
    report = check(target, **options)
    return report, time.perf_counter() - start


def run() -> dict:
    """Check every correct module, every buggy zoo module and every mutant: their rows, in that order."""
    check(target_path("ok_lazy.py:LazyAttention"))  # warm-up: imports, first calls
    rows = []
    for target, options in CORRECT.items():
        report, seconds = _timed(target_path(target), options)
        rows.append({"kind": "correct", "module or mutant": target, "expected": "PASS",
                     "got": report.bug or report.verdict.upper(), "ok": report.passed, "exit": report.exit_code,
                     "passed": report.passed, "s": seconds})
    for target, bug in BUGGY.items():  # "" = must fail without a catalogue id
        report, seconds = _timed(target_path(target), BUGGY_OPTIONS.get(target, {}))
        rows.append({"kind": "buggy", "module or mutant": target, "expected": bug or "FAIL",
                     "got": report.bug or report.verdict.upper(),
                     "ok": report.verdict == "fail" and (report.bug or "") == bug, "exit": report.exit_code,
                     "passed": report.passed, "s": seconds})
    with tempfile.TemporaryDirectory() as folder:
        for mutant in MUTANTS:
            report, seconds = _timed(write_mutant(Path(folder), mutant), mutant.options)
            rows.append({"kind": "mutant", "module or mutant": mutant.name, "expected": mutant.bug,
                         "got": report.bug or report.verdict.upper(), "ok": report.bug == mutant.bug,
                         "exit": report.exit_code, "passed": report.passed, "s": seconds})
    return rows


def result(rows: list[dict], load_before) -> SuiteResult:
    """The zoo's suite: one row per check, the goal metrics as targets."""
    by_kind = {kind: [r for r in rows if r["kind"] == kind] for kind in ("correct", "buggy", "mutant")}
    times = sorted(r["s"] for r in rows)
    named = sum(r["ok"] for r in by_kind["mutant"])
    false_pass = sum(r["passed"] for r in by_kind["mutant"] + by_kind["buggy"])
    suite = SuiteResult("check_zoo", "multihead check on its zoo: correct modules, buggy modules, mutants "
                        "(in-process, after one warm-up check)", ["kind", "module or mutant", "expected", "got", "s"],
                        [{k: r[k] for k in ("kind", "module or mutant", "expected", "got", "s")} for r in rows])
    suite.targets = [
        Target("correct modules that PASS", sum(r["ok"] for r in by_kind["correct"]), ">=", len(by_kind["correct"]),
               note=f"of {len(by_kind['correct'])} correct modules"),
        Target("mutants named right: share", named / max(len(by_kind["mutant"]), 1), ">=", 0.95,
               note=f"{named} of {len(by_kind['mutant'])} mutants"),
        Target("buggy zoo modules judged right", sum(r["ok"] for r in by_kind["buggy"]), ">=", len(by_kind["buggy"]),
               note=f"of {len(by_kind['buggy'])} buggy modules"),
        Target("false PASS (mutants and buggy modules)", false_pass, "<=", 0),
        Target("checks that could not run (exit 2)", sum(r["exit"] == 2 for r in rows), "<=", 1),
        Target("95th percentile s per check", times[int(0.95 * (len(times) - 1))], "<=", 2,
               note=f"median {statistics.median(times):.3f} s, max {times[-1]:.3f} s, over {len(rows)} checks"),
    ]
    load_after = os.getloadavg()
    suite.notes = [f"load average (1 min) {load_before[0]:.2f} before, {load_after[0]:.2f} after, on "
                   f"{os.cpu_count()} cores"]
    return suite


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="FILE", help="write the results as JSON (benchmarks/check_zoo.json)")
    parser.add_argument("--markdown", metavar="FILE",
                        help="write the table as markdown (benchmarks/check_zoo-results.md)")
    args = parser.parse_args()
    machine, load_before = describe(), os.getloadavg()
    suite = result(run(), load_before)
    for row in suite.rows:
        print(f"{row['s']:5.2f}s {row['module or mutant']:60s} want {row['expected']:28s} got {row['got']}")
    for target in suite.targets:
        print(f"{target.name}: {target.value} ({'met' if target.met else 'MISSED'}; goal {target.op} {target.goal})")
    if args.json:
        Path(args.json).write_text(json_line([suite], machine) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(markdown([suite]))


if __name__ == "__main__":
    main()
