"""Keys into the committed benchmark results, for tests/test_readme_figures.py and its map.

A key names one place a quoted figure comes from:

    <file>#<suite>|target|<target name>|value      (or |goal)
    <file>#<suite>|row|<row id>|<column>            row id: the row's non-empty text cells joined by " | "
    <file>#<suite>|note|<index>                     a figure written inside the suite's notes[index]
                                                    (for x: also either end of "ratios a to b")
    <file>#<suite>|target-note|<target name>        a figure written inside that target's note
    none: <why>                                     a number that is no measurement (a setting, a goal)

<file> is a file in benchmarks/ (results.json, decode.json, parallel.json, gpu-results.json); in
gpu-results.json a <suite> is one of its lists of rows.
"""
from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)\s?(x|×|ms|us|µs|MiB|GiB|GB/s|GFLOP/s|TFLOP/s|%)(?![\w])")
SAME_UNIT = {"×": "x", "µs": "us"}
RATIO_RANGE = re.compile(r"ratios (\d+\.\d+) to (\d+\.\d+)")  # "per-round ratios 0.98 to 1.05" in a note


def figures_in(text: str) -> list[tuple[str, str]]:
    """[(number as written, unit)] for every figure in `text`."""
    return [(num, SAME_UNIT.get(unit, unit)) for num, unit in FIGURE.findall(text)]


@cache
def results(name: str) -> dict:
    return json.loads((ROOT / "benchmarks" / name).read_text())


def suites(name: str) -> dict:
    """{suite: {"rows": [...], "targets": [...], "notes": [...], "title": str}} of one results file."""
    data = results(name)
    if "suites" in data:
        return data["suites"]
    return {k: {"rows": v, "targets": [], "notes": [], "title": ""} for k, v in data.items() if isinstance(v, list)}


def row_ids(rows: list[dict]) -> list[str]:
    """Each row's id: its text and integer cells joined by " | ", with "@n" on the n-th repeat."""
    ids, seen = [], {}
    for row in rows:
        base = " | ".join(str(v) for v in row.values() if (isinstance(v, str) and v) or type(v) is int)
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base} @{seen[base]}")
    return ids


def numbers_at(key: str, unit: str) -> list[float]:
    """The values a key holds, in the figure's unit (a share quoted in % is the target value x 100)."""
    file, rest = key.split("#", 1)
    suite_name, kind, *path = rest.split("|")
    suite = suites(file)[suite_name]
    if kind == "target" or kind == "target-note":
        name = "|".join(path[:-1]) if kind == "target" else "|".join(path)
        target = next(t for t in suite["targets"] if t["name"] == name)
        if kind == "target-note":
            return in_text(target["note"], unit)
        value = target[path[-1]]
        return [] if value is None else [value * 100 if unit == "%" and "share" in name else value]
    if kind == "row":
        ident, column = "|".join(path[:-1]), path[-1]
        row = suite["rows"][row_ids(suite["rows"]).index(ident)]
        value = row[column]
        return [] if value is None else [value / 1000 if unit == "TFLOP/s" and "GFLOP" in str(row.get("unit")) else value]
    if kind == "note":
        return in_text(suite["notes"][int(path[0])], unit)
    raise KeyError(key)


def in_text(text: str, unit: str) -> list[float]:
    """The figures of `unit` written in a note; for "x" also the ends of "ratios a to b"."""
    found = [float(n) for n, u in figures_in(text) if u == unit]
    return found + ([float(v) for pair in RATIO_RANGE.findall(text) for v in pair] if unit == "x" else [])


def matches(number: str, values: list[float]) -> bool:
    decimals = len(number.split(".")[1]) if "." in number else 0
    return any(abs(v - float(number)) <= 0.5 * 10**-decimals + 1e-9 for v in values)


def all_keys(unit: str):
    """Every key of every results file whose values could be quoted in `unit` (for the map's generator)."""
    for file in ("results.json", "decode.json", "parallel.json", "gpu-results.json"):
        for suite_name, suite in suites(file).items():
            for t in suite["targets"]:
                for field in ("value", "goal"):
                    yield f"{file}#{suite_name}|target|{t['name']}|{field}"
                yield f"{file}#{suite_name}|target-note|{t['name']}"
            for ident, row in zip(row_ids(suite["rows"]), suite["rows"]):
                for column, value in row.items():
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        yield f"{file}#{suite_name}|row|{ident}|{column}"
            for i in range(len(suite["notes"])):
                yield f"{file}#{suite_name}|note|{i}"
