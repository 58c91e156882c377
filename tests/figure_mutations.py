"""Mutations of the quoted figures and of the committed results: the figure test must catch each.

For every tied number (a key, or a cell of a line the report renders) two mutations, each checked
alone:

- doc side: the number is changed in the doc (rounded as it was written, so it reads like a real
  figure), and the line's entry is carried over to the edited line, as a careless editor would;
- result side: the value it is tied to is changed in the results (a note's figure in its text).

Caught means: `figure_docs.problems` reports the mutated line. Declared numbers (no measured figure) are
counted apart: by design nothing ties them.

    python tests/figure_mutations.py        # every mutation; prints the counts and any that escaped
"""
from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass

from figure_docs import RENDERED, Number, figure_map, numbers_in, problems, quoting_docs
from figure_keys import ROOT, Results, row_and_column, row_ids, tokens, written

from multihead.bench.report import cell, target_cells
from multihead.bench.results import Target


@dataclass(frozen=True)
class Tie:
    """One tied number: where it is, and the places in the results it is tied to (a key's one place, or
    every value of the row, target or note a rendered line shows)."""

    number: Number
    entry: str
    places: tuple[tuple, ...]  # (file, *path[, label]) into Results.data


def other_number(text: str) -> str:
    """A different figure written the same way: same decimals (or mantissa), date, or version."""
    match = tokens(text)[0]
    if match["date"]:
        return str(int(text[:4]) + 1) + text[4:]
    if match["version"]:
        head, last = re.match(r"(.*\.)(\d+)", text).groups()
        return head + str(int(last) + 1) + text[len(head) + len(last):]
    mantissa, e, exponent = text.partition("e")
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    value = float(mantissa.replace(",", "")) * 1.5 + 1
    new = f"{value:,.{decimals}f}" if "," in mantissa else f"{value:.{decimals}f}"
    return new + e + exponent


def other_value(value):
    """A different value: numbers x 1.5 + 1 (ints stay ints), a text's first number changed."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value * 2 + 1
    if isinstance(value, float):
        return value * 1.5 + 1
    found = tokens(value)
    return value if not found else value[:found[0].start()] + other_number(written(found[0])) + \
        value[found[0].start() + len(written(found[0])):]


def place_of(key: str, results: Results) -> tuple:
    """Where in Results.data the key's value lives: (file, *path) and, for a note, ("label", label)."""
    file, rest = key.split("#", 1)
    kind, *path = rest.split("|")
    if kind == "machine":
        return (file, "machine", path[0], *(int(i) for i in path[1:]))
    if kind == "field":
        return (file, *field_place(results.data[file], path, key))
    suite_name, (kind, *path) = kind, path
    suite = results.suites(file)[suite_name]
    root = ("suites", suite_name) if "suites" in results.data[file] else ()
    if kind in ("target", "target-note"):
        name = "|".join(path[:-1])
        i = next(i for i, t in enumerate(suite["targets"]) if t["name"] == name)
        return (file, *root, "targets", i, path[-1]) if kind == "target" else \
            (file, *root, "targets", i, "note", ("label", path[-1]))
    if kind == "row":
        index, column = row_and_column(suite["rows"], path, key, row_ids(suite["rows"]))
        rows = (*root, "rows") if root else (suite_name,)  # gpu-results.json: a suite is its list of rows
        return (file, *rows, index, column)
    if kind == "note":
        return (file, *root, "notes", int(path[0]), ("label", "|".join(path[1:])))
    raise KeyError(key)


def field_place(data, path: list[str], key: str) -> tuple:
    """A field key's path into `data` (list indices as integers; a text's label as ("label", label))."""
    holder, out = data, []
    for i, step in enumerate(path):
        if isinstance(holder, str):
            return (*out, ("label", "|".join(path[i:])))
        step = int(step) if isinstance(holder, list) else step
        holder = holder[step]
        out.append(step)
    return (*out, ("label", "^")) if isinstance(holder, str) else tuple(out)


def rendered_places(line: str, file: str, results: Results) -> tuple[tuple, ...]:
    """Every value a rendered line shows: the row, the target, the note or the title that renders as `line`."""
    places = []
    for name, suite in results.suites(file).items():
        root = (file, "suites", name)
        columns = list(dict.fromkeys(k for row in suite["rows"] for k in row))
        for i, row in enumerate(suite["rows"]):
            if "| " + " | ".join(cell(c, row.get(c)) for c in columns) + " |" == line:
                places += [(*root, "rows", i, c) for c, v in row.items() if isinstance(v, (int, float))]
                places += [(*root, "rows", i, c, ("at", j)) for c, v in row.items() if isinstance(v, str)
                           for j in range(len(tokens(v)))]
        for i, t in enumerate(suite["targets"]):
            if "| " + " | ".join(target_cells(Target(t["name"], t["value"], t["op"], t["goal"], t["note"]))) + " |" == line:
                places += [(*root, "targets", i, f) for f in ("value", "goal") if t[f] is not None]
                places += [(*root, "targets", i, "note", ("at", j)) for j in range(len(tokens(t["note"])))]
        if f"### {suite['title']}" == line:
            places += [(*root, "title", ("at", j)) for j in range(len(tokens(suite["title"])))]
        for i, note in enumerate(suite["notes"]):
            if f"- {note}" == line:
                places += [(*root, "notes", i, ("at", j)) for j in range(len(tokens(note)))]
    return tuple(places)


def ties(results: Results) -> Iterator[Tie | Number]:
    """Every number of every doc: a Tie where it is tied, the Number where it is declared."""
    for doc in quoting_docs():
        entries = figure_map().get(doc, {})
        for n in numbers_in(doc, (ROOT / doc).read_text()):
            entry = entries[n.text]
            item = entry if isinstance(entry, str) else entry[n.index]
            if item.startswith(RENDERED):
                yield Tie(n, item, rendered_places(n.text, item[len(RENDERED):], results))
            elif "#" in item:
                yield Tie(n, item, (place_of(item, results),))
            else:
                yield n


def caught(doc: str, line: int, text: str, entries: dict, results: Results) -> bool:
    return any(p.startswith(f"{doc}:{line}:") or p.startswith(f"{doc}:{line} ")
               for p in problems(doc, text, entries, results))


def doc_side(tie: Tie, results: Results) -> bool:
    """Change the number in the doc (the entry carried over to the edited line); True if caught."""
    n = tie.number
    lines = (ROOT / n.doc).read_text().split("\n")
    edited = n.text[:n.start] + other_number(n.written) + n.text[n.end:]
    lines[n.line - 1] = edited
    entries = dict(figure_map().get(n.doc, {}))
    entries[edited] = entries[n.text]
    return caught(n.doc, n.line, "\n".join(lines), entries, results)


def result_side(tie: Tie, place: tuple, results: Results) -> bool:
    """Change the value at `place` in the results (then put it back); True if caught."""
    file, *path = place
    *parents, last = path
    label = None
    if isinstance(last, tuple):
        label, (*parents, last) = last, parents
    holder = results.data[file]
    for step in parents:
        holder = holder[step]
    before = holder[last]
    holder[last] = other_value(before) if label is None else _other_in_text(before, label)
    results.memo.clear()
    try:
        text = (ROOT / tie.number.doc).read_text()
        return caught(tie.number.doc, tie.number.line, text, figure_map().get(tie.number.doc, {}), results)
    finally:
        holder[last] = before
        results.memo.clear()


def _other_in_text(text: str, label: tuple) -> str:
    """The text with one figure changed: the first after a label, or the j-th (("at", j))."""
    kind, value = label
    if kind == "at":
        match = tokens(text)[value]
    else:
        start = 0 if value == "^" else text.index(value) + len(value)
        match = tokens(text[start:])[0]
        match_start = start + match.start()
        return text[:match_start] + other_number(written(match)) + text[match_start + len(written(match)):]
    return text[:match.start()] + other_number(written(match)) + text[match.start() + len(written(match)):]


def run(every: int = 1) -> dict:
    """Every `every`-th tie mutated on both sides: the counts, and the mutations that escaped."""
    results = Results()
    counts = {"doc side": 0, "result side": 0, "declared": 0, "escaped": []}
    done = set()  # (doc, line, place): a rendered line's places are mutated once, not once per number
    for i, tie in enumerate(ties(results)):
        if isinstance(tie, Number):
            counts["declared"] += 1
            continue
        if i % every:
            continue
        counts["doc side"] += 1
        if not doc_side(tie, results):
            counts["escaped"].append(f"doc side: {tie.number.where()} ({tie.entry})")
        for place in tie.places:
            if (tie.number.doc, tie.number.line, place) in done:
                continue
            done.add((tie.number.doc, tie.number.line, place))
            counts["result side"] += 1
            if not result_side(tie, place, results):
                counts["escaped"].append(f"result side: {tie.number.where()} <- {place}")
        if not tie.places:
            counts["escaped"].append(f"result side: {tie.number.where()}: no place in the results found")
    return counts


if __name__ == "__main__":
    found = run(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
    print(f"doc-side mutations: {found['doc side']}, result-side mutations: {found['result side']}, "
          f"declared numbers (not mutated): {found['declared']}, escaped: {len(found['escaped'])}")
    print("\n".join(found["escaped"]))
