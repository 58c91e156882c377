"""`multihead check` against its goal metrics on the zoo (tests/check_zoo), its buggy modules and its mutants.

Every correct module must PASS, at least 95% of the mutants must get the right bug id, no mutant may
PASS, at most one check may fail to run (exit 2), and one check takes at most 2 s on this machine.

    python benchmarks/check_zoo.py [--markdown]

prints the counts, the slowest checks and (with --markdown) the tables used in docs/check.md.
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

from multihead.checker import check  # noqa: E402


def _timed(target: str, options: dict):
    start = time.perf_counter()
    report = check(target, **options)
    return report, time.perf_counter() - start


def run() -> dict:
    """Check every correct module and every mutant; return the rows and the totals."""
    check(target_path("ok_lazy.py:LazyAttention"))  # warm-up: imports, first calls
    load_before = os.getloadavg()
    rows = []
    for target, options in CORRECT.items():
        report, seconds = _timed(target_path(target), options)
        rows.append({"kind": "correct", "name": target, "want": "PASS", "got": report.bug or report.verdict.upper(),
                     "ok": report.passed, "exit": report.exit_code, "seconds": seconds})
    for target, bug in BUGGY.items():  # "" = must fail without a catalogue id
        report, seconds = _timed(target_path(target), BUGGY_OPTIONS.get(target, {}))
        rows.append({"kind": "buggy", "name": target, "want": bug or "FAIL",
                     "got": report.bug or report.verdict.upper(),
                     "ok": report.verdict == "fail" and (report.bug or "") == bug, "exit": report.exit_code,
                     "seconds": seconds, "passed": report.passed})
    with tempfile.TemporaryDirectory() as folder:
        for mutant in MUTANTS:
            report, seconds = _timed(write_mutant(Path(folder), mutant), mutant.options)
            rows.append({"kind": "mutant", "name": mutant.name, "want": mutant.bug,
                         "got": report.bug or report.verdict.upper(), "ok": report.bug == mutant.bug,
                         "exit": report.exit_code, "seconds": seconds, "passed": report.passed})
    correct = [r for r in rows if r["kind"] == "correct"]
    mutants = [r for r in rows if r["kind"] == "mutant"]
    buggy = [r for r in rows if r["kind"] == "buggy"]
    times = [r["seconds"] for r in rows]
    totals = {
        "correct modules": len(correct), "correct that PASS": sum(r["ok"] for r in correct),
        "mutants": len(mutants), "mutants named right": sum(r["ok"] for r in mutants),
        "buggy zoo modules": len(buggy), "buggy zoo modules judged right": sum(r["ok"] for r in buggy),
        "mutants that PASS (false PASS)": sum(r["passed"] for r in mutants),
        "buggy zoo modules that PASS (false PASS)": sum(r["passed"] for r in buggy),
        "could not run (exit 2)": sum(r["exit"] == 2 for r in rows),
        "median s per check": round(statistics.median(times), 3),
        "95th percentile s per check": round(sorted(times)[int(0.95 * (len(times) - 1))], 3),
        "max s per check": round(max(times), 3),
        "load average (1 min) before / after":
            f"{load_before[0]:.1f} / {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores",
    }
    return {"rows": rows, "totals": totals}


def markdown(result: dict) -> str:
    """The totals, every miss, and the slowest checks, as markdown tables."""
    totals = result["totals"]
    lines = ["| measure | value |", "|---|---|"] + [f"| {k} | {v} |" for k, v in totals.items()]
    misses = [r for r in result["rows"] if not r["ok"]]
    if misses:
        lines += ["", "| module | expected | got |", "|---|---|---|"]
        lines += [f"| {r['name']} | {r['want']} | {r['got']} |" for r in misses]
    slow = sorted(result["rows"], key=lambda r: -r["seconds"])[:5]
    lines += ["", "| slowest checks | s |", "|---|---|"] + [f"| {r['name']} | {r['seconds']:.2f} |" for r in slow]
    lines += ["", "<details><summary>every check: expected, got, seconds</summary>", "",
              "| module or mutant | expected | got | s |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['want']} | {r['got']} | {r['seconds']:.2f} |" for r in result["rows"]]
    return "\n".join(lines + ["", "</details>"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markdown", action="store_true", help="print markdown tables")
    args = parser.parse_args()
    result = run()
    if args.markdown:
        print(markdown(result))
        return
    for row in result["rows"]:
        mark = "ok  " if row["ok"] else "MISS"
        print(f"{mark} {row['seconds']:5.2f}s {row['name']:60s} want {row['want']:28s} got {row['got']}")
    for key, value in result["totals"].items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
