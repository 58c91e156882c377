"""Every number in the docs, each occurrence, against its entry in tests/readme_figures.json.

The docs: README.md, benchmarks/*.md but the runs' own tables (results.md and *-results.md, which
must be what the report renders from their JSON: `rendered_tables`; the held-out zoo's check_heldout-*.md,
which must be what its harness makes of its JSON, and decode-isa-results.md, what decode_isa.py makes of
its JSON), docs/*.md. Code (fenced blocks and
inline code) and link targets are code, not prose, and are skipped; every other number is checked.

readme_figures.json maps each doc to its lines that hold numbers, by the line's text (so an edited line
must be tied again: `python tests/figure_docs.py --carry` moves the entry of a reworded line whose
numbers stayed the same), and each line to its entries:

- a list, one entry per number on the line, in order: a key of the results (tests/figure_keys.py), the
  number must equal that value rounded as it is written; or a declaration (below);
- one string for every number on the line: a declaration, or "rendered: <file>" for a line that the
  report renders from benchmarks/<file> (a table copied from the run), which ties every cell on it.

A declaration says that a number is no measured figure, and which kind: "<kind>" or "<kind>: <why>",
with a kind of DECLARED (shapes, settings, goals, ids and the like). A measured figure has no
declaration: it is tied to a committed result, or it leaves the doc. An entry "unrecorded: ..." (a
figure measured outside the committed runs) is refused with that message.
"""
from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from functools import cache

from figure_keys import ROOT, Results, matches, tokens, unit_of, written

from multihead.bench.report import markdown
from multihead.bench.results import SuiteResult, Target

MAP_PATH = ROOT / "tests" / "readme_figures.json"
DECLARED = {
    "shape": "a tensor shape, a model dimension, or a size a bench or an example is run at",
    "setting": "a setting, a default, a threshold of a rule, or a budget",
    "goal": "a goal set for a measurement (not the measurement)",
    "version": "a version of a package, a standard or a language",
    "count": "a count in prose (two threads, 8 sequences, four ways) or a position in a list",
    "id": "part of a name: a model (Llama 4, GPT-2), a document (002), an issue or a section",
    "math": "a number in a formula, an example value, an index or a constant",
    "tolerance": "a bound the tests assert (within 1e-5)",
    "date": "a date that is not a run's",
    "hardware": "a property of the machine's hardware (a cache's size) that no results file records",
}
UNRECORDED = "unrecorded"  # a measured figure with no committed result: refused (tie it or take it out)
RENDERED = "rendered: "


@dataclass(frozen=True)
class Number:
    """One number in a doc: where it is, as written, and its unit."""

    doc: str
    line: int  # 1-based
    text: str  # the whole line, as the map knows it
    index: int  # its place among the line's numbers
    count: int  # how many numbers the line holds
    written: str
    unit: str
    start: int  # its column in the line
    end: int

    def where(self) -> str:
        return f"{self.doc}:{self.line}: {self.written}{self.unit} (number {self.index + 1} of {self.count} on the line)"


RUN_TABLES = {"results.md": "results.json", "decode-results.md": "decode.json", "latent-results.md": "latent.json",
              "parallel.md": "parallel.json", "check_zoo-results.md": "check_zoo.json",
              "quant-cache-results.md": "quant-cache.json", "loops-results.md": "loops.json",
              "loops-16384-results.md": "loops-16384.json", "loops-fp32-results.md": "loops-fp32.json",
              "loops-quick-results.md": "loops-quick.json"}  # benchmarks/<md>: what `--markdown` wrote from benchmarks/<json>
# benchmarks/<md>: what benchmarks/<script>'s `markdown` makes of benchmarks/<json> (the held-out zoo's runs; the
# decode kernel of every build against the plain-torch form, also with torch held to AVX2; the decode kernel's
# goals per build; peak memory with and without sinks; the sparse decode
# step and V3.2 layer step)
HARNESS_TABLES = {"check_heldout-before.md": ("check_heldout-before.json", "check_heldout.py"),
                  "check_heldout-blind.md": ("check_heldout-blind.json", "check_heldout.py"),
                  "check_heldout-after.md": ("check_heldout-after.json", "check_heldout.py"),
                  "check_heldout_2026-blind.md": ("check_heldout_2026-blind.json", "check_heldout.py"),
                  "check_heldout_2026-after.md": ("check_heldout_2026-after.json", "check_heldout.py"),
                  "decode-isa-results.md": ("decode-isa.json", "decode_isa.py"),
                  "decode-isa-avx2-results.md": ("decode-isa-avx2.json", "decode_isa.py"),
                  "decode-goals-results.md": ("decode-goals.json", "decode_goals.py"),
                  "sinks-memory-results.md": ("sinks-memory.json", "sinks_memory.py"),
                  "sparse-decode-results.md": ("sparse-decode.json", "sparse_decode.py")}


def quoting_docs() -> list[str]:
    """README.md, benchmarks/*.md but the runs' own tables (RUN_TABLES, HARNESS_TABLES), docs/*.md."""
    bench = [p for p in sorted((ROOT / "benchmarks").glob("*.md")) if p.name not in {*RUN_TABLES, *HARNESS_TABLES}]
    return ["README.md", *(str(p.relative_to(ROOT)) for p in [*bench, *sorted((ROOT / "docs").glob("*.md"))])]


def prose_lines(markdown_text: str) -> list[str]:
    """The text's lines with fenced code blocks, inline code (even across lines) and link targets blanked
    to spaces, so that every number keeps its column."""
    lines = markdown_text.split("\n")
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced, lines[i] = not fenced, " " * len(line)
        elif fenced:
            lines[i] = " " * len(line)
    text = "\n".join(lines)
    text = re.sub(r"`[^`]*`", _blank, text)
    return re.sub(r"(?<=\])\([^)]*\)", _blank, text).split("\n")


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match[0])


def numbers_in(doc: str, markdown_text: str) -> list[Number]:
    """Every number of the doc's prose, each occurrence, in order."""
    raw = markdown_text.split("\n")
    out = []
    for i, line in enumerate(prose_lines(markdown_text)):
        found = tokens(line)
        out += [Number(doc, i + 1, raw[i].rstrip(), j, len(found), written(m), unit_of(m), m.start(), m.start() + len(written(m)))
                for j, m in enumerate(found)]
    return out


@cache
def figure_map() -> dict[str, dict[str, str | list[str]]]:
    return json.loads(MAP_PATH.read_text())


def rendered_lines(results: Results, file: str) -> set[str]:
    """The lines of the Markdown the report renders from benchmarks/<file> (made once per Results)."""
    key = ("rendered", file)
    if key not in results.memo:
        results.memo[key] = {line.rstrip() for line in render(results, file).split("\n")}
    return results.memo[key]


def render(results: Results, file: str) -> str:
    """benchmarks/<file> rendered as `multihead bench --markdown` writes it (columns in row order)."""
    suites = []
    for name, s in results.suites(file).items():
        columns = list(dict.fromkeys(k for row in s["rows"] for k in row))
        targets = [Target(t["name"], t["value"], t["op"], t["goal"], t["note"]) for t in s["targets"]]
        suites.append(SuiteResult(name, s["title"], columns, s["rows"], targets, s["notes"]))
    return markdown(suites)


def problems(doc: str, markdown_text: str, entries: dict, results: Results) -> list[str]:
    """What is wrong with the doc's numbers against its entries: one message per number (or stale line)."""
    numbers = numbers_in(doc, markdown_text)
    out, seen = [], set()
    for n in numbers:
        seen.add(n.text)
        entry = entries.get(n.text)
        if entry is None:
            if n.index == 0:
                out.append(missing(n, [(m.written, m.unit) for m in numbers if m.line == n.line], results))
            continue
        out += [m for m in [check(n, entry, results)] if m]
    out += [f"tests/readme_figures.json ties a line {doc} no longer has (edit it to the new text or remove it): "
            f"{line!r}" for line in entries if line not in seen]
    return out


def check(n: Number, entry: str | list[str], results: Results) -> str | None:
    """None if the number is tied and equals its value, else what is wrong."""
    if isinstance(entry, str):
        if entry.startswith(RENDERED):
            file = entry[len(RENDERED):]
            ok = n.text in rendered_lines(results, file)
            return None if ok else f"{n.where()}: the line is not one the report renders from benchmarks/{file}"
        return declaration_problem(n, entry)
    if len(entry) != n.count:
        return f"{n.where()}: the line has {n.count} numbers but {len(entry)} entries" if n.index == 0 else None
    item = entry[n.index]
    if "#" not in item:
        return declaration_problem(n, item)
    try:
        values = results.values(item, n.unit)
    except (KeyError, IndexError, ValueError) as e:
        return f"{n.where()}: its key does not resolve: {e}"
    if not matches(n.written, values):
        return f"{n.where()}: {item} holds {values}"
    return None


def declaration_problem(n: Number, entry: str) -> str | None:
    kind = entry.partition(": ")[0]
    if kind == UNRECORDED:
        return (f"{n.where()}: a measured figure with no committed result cannot stay: tie it to the results "
                "file of a run that holds it (commit the run), or take it out of the doc")
    if kind not in DECLARED:
        return f"{n.where()}: {entry!r} is neither a key nor a declared kind ({', '.join(DECLARED)})"
    return None


def missing(n: Number, line_numbers: list[tuple[str, str]], results: Results) -> str:
    """The message for a line with no entry: the line, its numbers, and what to add."""
    hints = [f"  {w}{u}: " + (", ".join(results.holding(w, u)[:3]) or "no result holds it; declare its kind")
             for w, u in line_numbers]
    return (f"{n.doc}:{n.line} holds {n.count} number(s) with no entry in tests/readme_figures.json. Add, under "
            f"{n.doc!r}, the line {n.text!r} with a list of {n.count} entries (a key, or a kind of "
            f"{', '.join(DECLARED)}), one per number:\n" + "\n".join(hints))


def all_problems(results: Results | None = None, texts: dict[str, str] | None = None,
                 entries: dict | None = None) -> dict[str, list[str]]:
    """{doc: problems} over every quoting doc (the texts, map and results given, else the committed ones)."""
    results = results or Results()
    entries = figure_map() if entries is None else entries
    out = {}
    for doc in quoting_docs():
        text = texts[doc] if texts and doc in texts else (ROOT / doc).read_text()
        out[doc] = problems(doc, text, entries.get(doc, {}), results)
    return out


def carry_over(entries: dict, doc: str, text: str) -> list[str]:
    """Move each entry whose line was reworded, its numbers the same and in the same order, to the new line
    (their values are still checked); returns the lines moved. A line whose numbers changed is left to tie
    by hand."""
    lines = {}
    for n in numbers_in(doc, text):
        lines.setdefault(n.text, []).append((n.written, n.unit))
    stale = {}
    for old in (line for line in entries if line not in lines):
        stale.setdefault(tuple((n.written, n.unit) for n in numbers_in(doc, old)), []).append(old)
    moved = []
    for line, found in lines.items():
        olds = stale.get(tuple(found), [])
        if line not in entries and len(olds) == 1:
            entries[line] = entries.pop(olds.pop())
            moved.append(line)
    order = list(lines)
    entries_sorted = sorted(entries.items(), key=lambda kv: order.index(kv[0]) if kv[0] in lines else len(order))
    entries.clear()
    entries.update(entries_sorted)
    return moved


def write_map(entries_by_doc: dict) -> None:
    """tests/readme_figures.json, one line of a doc per line of the file."""
    docs = [f" {json.dumps(doc)}: {{\n" + ",\n".join(f"  {json.dumps(line, ensure_ascii=False)}: "
                                                      f"{json.dumps(entry, ensure_ascii=False)}"
                                                      for line, entry in entries.items()) + "\n }"
            for doc, entries in entries_by_doc.items()]
    MAP_PATH.write_text("{\n" + ",\n".join(docs) + "\n}\n")


if __name__ == "__main__":  # python tests/figure_docs.py [--carry] [DOC]: what is missing or wrong
    if "--carry" in sys.argv:  # after rewording lines: move their entries to the new text
        mapped = json.loads(MAP_PATH.read_text())
        for doc in quoting_docs():
            for line in carry_over(mapped.setdefault(doc, {}), doc, (ROOT / doc).read_text()):
                print(f"moved: {doc}: {line}")
        write_map({doc: entries for doc, entries in mapped.items() if entries})
        figure_map.cache_clear()
    wanted = [a for a in sys.argv[1:] if not a.startswith("--")]
    for doc, found in all_problems().items():
        if found and (not wanted or doc in wanted):
            print("\n".join(found))
