"""Keys into the committed benchmark results: what a number quoted in a doc is tied to.

A key names one place in benchmarks/<file> (results.json, decode.json, latent.json, parallel.json,
gpu-results.json, check_zoo.json) that a quoted number comes from:

    <file>#<suite>|target|<target name>|value          (or |goal)
    <file>#<suite>|target-note|<target name>|<label>    the first number after <label> in that target's note
    <file>#<suite>|row|<row id>|<column>                 row id: see row_ids()
    <file>#<suite>|note|<index>|<label>                  the first number after <label> in notes[index]
    <file>#machine|<field>                               the run's machine entry (cpu, cores, torch, date ...)
    <file>#machine|<field>|<index>                       one of a list (load_average|0: the 1-minute one)
    <file>#field|<key>|<key>...[|<label>]                 a value at that path of the file's dicts and lists (a
                                                         list's index as an integer); where the path reaches a
                                                         text, the first number after <label> in it ("^": its first)

A <label> must occur once in its text (a number of its own, or the text right before the figure, as
"raw SDPA" in "raw SDPA 17%"), so that a key ties one figure of a note, never any figure in it.
In gpu-results.json a <suite> is one of its lists of rows. The results are read through a `Results`
object, so that the mutation test can hand in changed copies.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_FILES = ("results.json", "decode.json", "latent.json", "parallel.json", "gpu-results.json", "check_zoo.json",
                "quant-cache.json", "quant-drift.json", "core-seam.json", "core-seam-breakdown.json",
                "sparse-decode.json", "loops.json", "loops-16384.json", "loops-fp32.json", "loops-quick.json",
                "decode-goals.json", "quant-prompt.json", "cache-cascade.json", "merge-split.json",
                "sparse-prefill-boundary.json", "check_cli_time.json", "check_heldout_2026-blind.json",
                "check_heldout_2026-after.json", "core-seam-avx512.json", "core-seam-avx2.json")
SAME_UNIT = {"×": "x", "µs": "us"}
UNITS = "ms|us|µs|s|MiB|GiB|KiB|MB|GB/s|GB|GFLOP/s|TFLOP/s|%"
# One number as the docs and the notes write it, not inside a word or a decimal (fp32, H100 and 1.5's 5
# are none): a date with its time, a version (2.13.0+cpu), or a number (10,000 / 4.8e-7 / 2.95e+03 / 0.416)
# with its unit: x or × written against it (1.85x; "8 x 512" is two numbers), the others also after
# one space; or letters written against it (16k, 2nd).
TOKEN = re.compile(
    r"(?<![\w])(?<!\d\.)(?:(?P<date>\d{4}-\d{2}-\d{2}(?: \d{2}:\d{2})?)"
    r"|(?P<version>\d+\.\d+\.\d+(?:\+\w+)?)"
    r"|(?P<number>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
    rf"(?:(?P<unit>x|×|%|\s?(?:{UNITS}))(?!\w)|(?P<suffix>[A-Za-z]\w*))?)")


def tokens(text: str) -> list[re.Match]:
    """Every number of `text` (see TOKEN), in order."""
    return list(TOKEN.finditer(text))


def written(match: re.Match) -> str:
    """The number itself as written: the date, the version or the number, without its unit."""
    return match["date"] or match["version"] or match["number"]


def unit_of(match: re.Match) -> str:
    """The unit written with the number ("" for none): 1.85× -> "x", 4 ms -> "ms"."""
    unit = (match["unit"] or "").strip()
    return SAME_UNIT.get(unit, unit)


class Results:
    """The committed results files, read once (or copies of them, changed by a mutation)."""

    def __init__(self, data: dict[str, dict] | None = None):
        self.data = data if data is not None else {f: json.loads((ROOT / "benchmarks" / f).read_text())
                                                   for f in RESULT_FILES}
        self._by_unit: dict[str, list[tuple[str, list]]] = {}
        self.memo: dict = {}  # what is derived from the data once: row ids, rendered tables

    def holding(self, number: str, unit: str) -> list[str]:
        """The keys whose value the number, as written, equals (the hint a missing entry gets)."""
        if unit not in self._by_unit:
            table = []
            for key in all_keys(self):
                try:
                    table.append((key, self.values(key, unit)))
                except (KeyError, IndexError, ValueError, TypeError):
                    continue
            self._by_unit[unit] = table
        return [key for key, values in self._by_unit[unit] if matches(number, values)]

    def changed(self) -> Results:
        """A deep copy to change (the mutation test)."""
        return Results(copy.deepcopy(self.data))

    def suites(self, file: str) -> dict:
        """{suite: {"rows": [...], "targets": [...], "notes": [...], "title": str}} of one results file."""
        data = self.data[file]
        if "suites" in data:
            return data["suites"]
        return {k: {"rows": v, "targets": [], "notes": [], "title": ""} for k, v in data.items()
                if isinstance(v, list) and v and all(isinstance(row, dict) for row in v)}

    def values(self, key: str, unit: str) -> list:
        """The values `key` holds, in the quoted figure's unit: [] where it holds none. A share target
        quoted in % is its value x 100; a GFLOP/s row quoted in TFLOP/s is divided by 1000 (SCALES)."""
        file, rest = key.split("#", 1)
        if file not in self.data:
            raise KeyError(f"{key}: no results file benchmarks/{file}")
        kind, *path = rest.split("|")
        if kind == "machine":
            value = self.data[file]["machine"][path[0]]
            return [value[int(path[1])] if len(path) > 1 else value]
        if kind == "field":
            value, label = field_at(self.data[file], path, key)
            if label is not None:
                return figure_after(value, label, key)
            return [] if value is None else [value]
        suite_name = kind
        suite = self.suites(file)[suite_name]
        kind, *path = path
        if kind == "target":
            target = _target(suite, "|".join(path[:-1]))
            value = target[path[-1]]
            return [] if value is None else [value * 100 if unit == "%" and "share" in target["name"] else value]
        if kind == "target-note":
            return figure_after(_target(suite, "|".join(path[:-1]))["note"], path[-1], key)
        if kind == "row":
            ids_key = ("ids", file, suite_name)
            if ids_key not in self.memo:
                self.memo[ids_key] = row_ids(suite["rows"])
            index, column = row_and_column(suite["rows"], path, key, self.memo[ids_key])
            row = suite["rows"][index]
            value = row[column]
            return [] if value is None else [value / _scale(unit, f"{column} {row.get('unit', '')}")]
        if kind == "note":
            return figure_after(suite["notes"][int(path[0])], "|".join(path[1:]), key)
        raise KeyError(f"{key}: unknown kind {kind!r}")


SCALES = {("TFLOP/s", "GFLOP"): 1000, ("MiB", "KiB"): 1024}  # (the quote's unit, the results' unit): divide by


def _scale(unit: str, where: str) -> float:
    """What a results value is divided by to be quoted in `unit` (where: its column and row unit)."""
    return next((by for (quoted, held), by in SCALES.items() if quoted == unit and held in where), 1)


def row_and_column(rows: list[dict], path: list[str], key: str, ids: list[str]) -> tuple[int, str]:
    """(the index of the row, the column) a row key's path names (a column's name may hold "|", as
    "max |diff|" does); ids: row_ids(rows)."""
    for cut in range(len(path) - 1, 0, -1):
        ident, column = "|".join(path[:cut]), "|".join(path[cut:])
        if ident in ids and column in rows[ids.index(ident)]:
            return ids.index(ident), column
    raise KeyError(f"{key}: no such row and column")


def field_at(data, path: list[str], key: str) -> tuple:
    """(the value at `path` in the JSON `data`, None), or (the text the path reaches, the rest of the path
    joined as a label)."""
    holder = data
    for i, step in enumerate(path):
        if isinstance(holder, str):
            return holder, "|".join(path[i:])
        try:
            holder = holder[int(step)] if isinstance(holder, list) else holder[step]
        except (KeyError, IndexError, ValueError) as e:
            raise KeyError(f"{key}: no field {step!r}") from e
    if isinstance(holder, str):
        return holder, "^"
    if isinstance(holder, (dict, list)):
        raise KeyError(f"{key}: the path ends at a {type(holder).__name__}, not a value")
    return holder, None


def field_paths(data, head: tuple = ()):
    """Every path to a number in `data` (a text: one path per figure in it, ending with its label)."""
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else ()
    for name, value in items:
        path = (*head, str(name))
        if isinstance(value, (dict, list)):
            yield from field_paths(value, path)
        elif isinstance(value, str):
            yield from ((*path, label) for label in labels(value))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            yield path


def _target(suite: dict, name: str) -> dict:
    found = [t for t in suite["targets"] if t["name"] == name]
    if not found:
        raise KeyError(f"no target {name!r}")
    return found[0]


def figure_after(text: str, label: str, key: str) -> list:
    """[the first number after `label` in `text`] ("^": the text's first number), a date or a version as
    written; the label must occur once."""
    start = 0
    if label != "^":
        count = text.count(label)
        if count != 1:
            raise KeyError(f"{key}: the label {label!r} occurs {count} times in {text[:80]!r}..., not once")
        start = text.index(label) + len(label)
    found = tokens(text[start:])
    return [] if not found else [as_number(found[0]["number"]) if found[0]["number"] else written(found[0])]


def as_number(written: str) -> float:
    return float(written.replace(",", ""))


def row_ids(rows: list[dict]) -> list[str]:
    """Each row's id: its text and integer cells joined by " | ", with "@n" on the n-th repeat."""
    ids, seen = [], {}
    for row in rows:
        base = " | ".join(str(v) for v in row.values() if (isinstance(v, str) and v) or type(v) is int)
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base} @{seen[base]}")
    return ids


def matches(written: str, values: list) -> bool:
    """Whether the number as written equals one of `values` rounded as it is written (a text value, as a
    version or a date, must start with it)."""
    try:
        number = as_number(written)
    except ValueError:  # a date or a version: only a text value can hold it
        number = None
    mantissa, _, exponent = written.lower().partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    step = 0.5 * 10 ** (int(exponent or 0) - decimals) if number is not None else 0.0
    for value in values:
        if isinstance(value, str):
            if value.startswith(written):
                return True
        elif number is not None and isinstance(value, (int, float)) and not isinstance(value, bool):
            if abs(value - number) <= step * (1 + 1e-9) + 1e-12:
                return True
    return False


def all_keys(results: Results):
    """Every key of every results file (with one label per figure of a note): the candidates a missing
    key is looked up among."""
    for file in RESULT_FILES:
        for field, value in results.data[file].get("machine", {}).items():
            if isinstance(value, list):
                yield from (f"{file}#machine|{field}|{i}" for i in range(len(value)))
            else:
                yield f"{file}#machine|{field}"
        if "suites" not in results.data[file]:
            yield from (f"{file}#field|" + "|".join(path) for path in
                        field_paths({k: v for k, v in results.data[file].items() if k != "machine"}))
        for suite_name, suite in results.suites(file).items():
            head = f"{file}#{suite_name}"
            for t in suite["targets"]:
                yield from (f"{head}|target|{t['name']}|{field}" for field in ("value", "goal"))
                yield from (f"{head}|target-note|{t['name']}|{label}" for label in labels(t["note"]))
            for ident, row in zip(row_ids(suite["rows"]), suite["rows"]):
                yield from (f"{head}|row|{ident}|{column}" for column, value in row.items()
                            if isinstance(value, (int, float)) and not isinstance(value, bool))
            for i, note in enumerate(suite["notes"]):
                yield from (f"{head}|note|{i}|{label}" for label in labels(note))


def labels(text: str) -> list[str]:
    """A label for each number in `text`: the shortest run of the words before it that occurs once."""
    out = []
    for i, match in enumerate(tokens(text)):
        if i == 0:
            out.append("^")
            continue
        words = text[:match.start()].rstrip().split(" ")
        for n in range(1, len(words) + 1):
            label = " ".join(words[-n:])
            if label and text.count(label) == 1:
                out.append(label)
                break
    return out
