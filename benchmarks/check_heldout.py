"""`multihead check` on the held-out zoo (benchmarks/check_heldout/), run the way a learner runs it.

Every case is checked in its own process (`python -m multihead check FILE.py:Target` with the case's
recorded --init / --config / --call hints), once with --lang en and once with --lang zh, and the verdict is
read from what the command prints and its exit code. The zoo is held out: nobody tunes the checker on it,
and these figures are reported, never asserted.

    python benchmarks/check_heldout.py [--zoo FOLDER] [--lang en zh] [--cases NAME ...] [--markdown FILE] [--json FILE]

--zoo picks another held-out zoo laid out the same way (cases/ and manifest.toml), e.g.
benchmarks/check_heldout_2026; the default is benchmarks/check_heldout.

prints a table per case, the totals, then one JSON line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ZOO = Path(__file__).resolve().parent / "check_heldout"
sys.path.insert(0, str(ZOO))

from zoo_files import write_cases  # noqa: E402  (the learner files, mutants rebuilt)

from multihead.bench.machine import cpu_flags, cpu_model  # noqa: E402  (the machine the checks ran on)

ID = re.compile(r"[(（]([a-z0-9]+(?:-[a-z0-9]+)+)[)）]")


def load_cases(names: list[str] | None = None, zoo: Path = ZOO) -> list[dict]:
    """The manifest's cases (all, or those named), in manifest order."""
    cases = tomllib.loads((zoo / "manifest.toml").read_text(encoding="utf-8"))["case"]
    if names:
        unknown = set(names) - {case["name"] for case in cases}
        if unknown:
            raise SystemExit(f"no such case: {', '.join(sorted(unknown))}")
        cases = [case for case in cases if case["name"] in names]
    return cases


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200", "PYTHONIOENCODING": "utf-8"}
    return subprocess.run([sys.executable, "-m", "multihead", "check", *args], capture_output=True, text=True,
                          encoding="utf-8", env=env, timeout=timeout)


def known_bug_ids() -> set[str]:
    """The catalogue's ids, from `multihead check --list-bugs` where the CLI has it, else its public list."""
    listed = _cli("--list-bugs")
    if listed.returncode == 0:
        return set(re.findall(r"^\s*([a-z0-9]+(?:-[a-z0-9]+)+)\b", listed.stdout, flags=re.MULTILINE))
    from multihead.checker import BUGS  # older CLIs: no --list-bugs
    return {bug.id for bug in BUGS}


def claims_supported() -> bool:
    """Whether --call takes a mask convention (mask=keep|block|...), as `check --help` says."""
    return "mask=" in _cli("--help").stdout


def command(case: dict, lang: str, with_claim: bool, folder: Path) -> list[str]:
    """The arguments a learner types for this case, its file written under folder."""
    args = [f"{folder / case['file']}:{case['target']}"]
    for option in ("init", "config"):
        if case.get(option):
            args += [f"--{option}", case[option]]
    hints = [case["call"]] if case.get("call") else []
    if with_claim and case.get("claim"):
        hints.append(f"mask={case['claim']}")
    if hints:
        args += ["--call", ",".join(hints)]
    return args + ["--lang", lang]


def verdict(returncode: int | None, output: str, ids: set[str]) -> str:
    """PASS, the bug id named, FAIL (no id), ERROR (exit 2) or TIMEOUT."""
    if returncode is None:
        return "TIMEOUT"
    if returncode == 0:
        return "PASS"
    if returncode != 1:
        return "ERROR"
    head = "\n".join(line for line in output.splitlines() if line.strip())[:1000].splitlines()[:3]
    for found in ID.findall("\n".join(head)):
        if found in ids:
            return found
    return "FAIL"


def right(expected: str, got: str) -> bool:
    if expected == "PASS":
        return got == "PASS"
    if expected == "FAIL":  # a mistake with no catalogue id yet: any FAIL is right
        return got not in ("PASS", "ERROR", "TIMEOUT")
    return got == expected


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def check_case(case: dict, lang: str, ids: set[str], with_claim: bool, timeout: float, folder: Path,
               reports: Path | None = None) -> dict:
    """One check in its own process: the verdict, its exit code, its wall and CPU seconds (children run one
    at a time, so the children's CPU clock's step is this process's); the report is kept under `reports`
    (as CASE.LANG.txt) when given."""
    start, cpu_start = time.perf_counter(), _children_cpu()
    try:
        done = _cli(*command(case, lang, with_claim, folder), timeout=timeout)
        returncode, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        returncode, output = None, ""
    seconds, cpu = time.perf_counter() - start, _children_cpu() - cpu_start
    if reports is not None:
        reports.mkdir(parents=True, exist_ok=True)
        (reports / f"{case['name']}.{lang}.txt").write_text(output, encoding="utf-8")
    got = verdict(returncode, output, ids)
    return {"got": got, "exit": returncode, "seconds": round(seconds, 3), "cpu_seconds": round(cpu, 3),
            "ok": right(case["expected"], got)}


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return round(ordered[round(share * (len(ordered) - 1))], 2) if ordered else 0.0


def totals(cases: list[dict], rows: list[dict], lang: str) -> dict:
    """The figures for one language."""
    runs = [(case, row[lang]) for case, row in zip(cases, rows)]
    correct = [run for case, run in runs if case["expected"] == "PASS"]
    buggy = [(case, run) for case, run in runs if case["expected"] != "PASS"]
    named = sum(run["ok"] for _, run in buggy)
    times = [run["seconds"] for _, run in runs]
    cpu = [run["cpu_seconds"] for _, run in runs]
    return {
        "correct PASS": f"{sum(run['ok'] for run in correct)} of {len(correct)}",
        "bug ids right": f"{named} of {len(buggy)} ({100 * named / max(len(buggy), 1):.0f}%)",
        "false PASS": sum(run["got"] == "PASS" for _, run in buggy),
        "exit 2": sum(run["exit"] == 2 for _, run in runs),
        "timeouts": sum(run["exit"] is None for _, run in runs),
        "p50 s per check": percentile(times, 0.5),
        "p95 s per check": percentile(times, 0.95),
        "p50 CPU s per check": percentile(cpu, 0.5),
        "p95 CPU s per check": percentile(cpu, 0.95),
    }


def run(cases: list[dict], langs: list[str], timeout: float, progress: bool = True, zoo: Path = ZOO,
        reports: Path | None = None) -> dict:
    """Check every case in every language; the rows, the totals per language and how it was run."""
    ids, with_claim = known_bug_ids(), claims_supported()
    started, load_before = datetime.datetime.now(datetime.timezone.utc), os.getloadavg()
    rows = []
    files = tempfile.TemporaryDirectory(prefix="heldout-")
    folder = write_cases(cases, Path(files.name) / "cases", zoo / "cases")
    for case in cases:
        row = {lang: check_case(case, lang, ids, with_claim, timeout, folder, reports) for lang in langs}
        rows.append(row)
        if progress:
            marks = "  ".join(f"{lang} {row[lang]['got']:<30s} {row[lang]['seconds']:5.1f}s" for lang in langs)
            print(f"{'ok  ' if all(r['ok'] for r in row.values()) else 'MISS'} {case['name']:22s} "
                  f"want {case['expected']:<30s} {marks}", flush=True)
    files.cleanup()
    agree = sum(len({row[lang]["got"] for lang in langs}) == 1 for row in rows)
    return {
        "zoo": zoo.name, "cases": cases, "rows": rows, "langs": langs,
        "totals": {lang: totals(cases, rows, lang) for lang in langs},
        "conditions": {
            "started": started.strftime("%Y-%m-%d %H:%M UTC"),
            "finished": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "cases": len(cases), "mask claims passed": with_claim, "EN and ZH verdicts agree": f"{agree} of {len(rows)}",
            "cpu cores": os.cpu_count(), "cpu": f"{cpu_model()} ({cpu_flags() or 'no vector flags listed'})",
            "load average (1 min) before / after": f"{load_before[0]:.1f} / {os.getloadavg()[0]:.1f}",
            "timing": "one `python -m multihead check` process, start included: wall seconds, and the CPU "
                      "seconds it used (user + system), which other jobs on the machine do not inflate",
        },
    }


def as_json(result: dict) -> dict:
    """What --json writes: the totals, the conditions and one row per case (the table is made from it)."""
    rows = [{"case": case["name"], "expected": case["expected"], **{lang: row[lang] for lang in result["langs"]}}
            for case, row in zip(result["cases"], result["rows"])]
    return {"suite": result.get("zoo", ZOO.name), "totals": result["totals"], "conditions": result["conditions"], "rows": rows}


def markdown(data: dict, zoo: Path | None = None) -> str:
    """The totals per language, how it was run, and one row per case, from what --json writes (`as_json`);
    each case's idiom and language come from the manifest of the zoo the JSON names (its "suite")."""
    langs = list(data["totals"])
    zoo = zoo or ZOO.parent / data.get("suite", ZOO.name)
    manifest = {case["name"]: case for case in load_cases(zoo=zoo)}
    keys = list(data["totals"][langs[0]])
    lines = ["| measure | " + " | ".join(lang.upper() for lang in langs) + " |", "|---" * (len(langs) + 1) + "|"]
    lines += [f"| {key} | " + " | ".join(str(data["totals"][lang][key]) for lang in langs) + " |" for key in keys]
    lines += ["", "| condition | value |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in data["conditions"].items()]
    header = "| case | idiom | lang | expected | " + " | ".join(f"got {lang.upper()}" for lang in langs)
    header += " | " + " | ".join(f"s {lang.upper()}" for lang in langs) + " |"
    lines += ["", header, "|---" * (4 + 2 * len(langs)) + "|"]
    for row in data["rows"]:
        case = manifest[row["case"]]
        gots = " | ".join(("" if row[lang]["ok"] else "**") + row[lang]["got"] + ("" if row[lang]["ok"] else "**")
                          for lang in langs)
        secs = " | ".join(f"{row[lang]['seconds']:.1f}" for lang in langs)
        lines.append(f"| {row['case']} | {case['idiom']} | {case['lang']} | {row['expected']} | {gots} | {secs} |")
    lines += ["", "A got in bold differs from the expected verdict. Expected FAIL: a mistake with no catalogue id "
              "yet; any FAIL is right."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--zoo", type=Path, default=ZOO, help="the held-out zoo's folder (default: %(default)s)")
    parser.add_argument("--lang", nargs="+", default=["en", "zh"], choices=["en", "zh"])
    parser.add_argument("--cases", nargs="+", metavar="NAME", help="only these cases (manifest names)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds before one check counts as TIMEOUT")
    parser.add_argument("--markdown", metavar="FILE", help="write the tables as markdown to FILE")
    parser.add_argument("--json", metavar="FILE", help="write the JSON line to FILE")
    parser.add_argument("--reports", type=Path, metavar="DIR", help="keep every check's report as DIR/CASE.LANG.txt")
    args = parser.parse_args(argv)
    zoo = args.zoo.resolve()
    result = run(load_cases(args.cases, zoo), args.lang, args.timeout, zoo=zoo, reports=args.reports)
    data = as_json(result)
    table, line = markdown(data, zoo), json.dumps(data, ensure_ascii=False)
    print(table)
    print(line)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n", encoding="utf-8")
    if args.json:
        Path(args.json).write_text(line + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
