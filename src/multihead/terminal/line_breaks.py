"""Line breaking for every terminal text the tools print (check's report, explain's stories, --help),
in English and Chinese alike.

Widths are terminal cells: a wide (Chinese) character takes 2. A line may break at a space or next to a
Chinese character, never inside a run of other non-space characters (a command, a bug id, a topic name,
code such as ``masked_fill(~keep,``), and never inside a ``multihead`` command while it fits on one line
(``multihead explain reshape-then-transpose`` moves down whole). Chinese closing punctuation never starts
a line and opening punctuation never ends one. Nothing is cut off: a piece wider than the whole line is
broken at its own spaces, then after "/" or ":" (a path), and only then folded.

``break_offsets(line, width)`` says where one line of text breaks (rich's styled Text is divided there);
``wrap(text, width)`` gives the lines.
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

CLOSING = set("，。、；：！？）》」』”’…")   # never at the start of a line
OPENING = set("（《「『“‘")                 # never at the end of a line
SUBCOMMANDS = ("explain", "check", "bench")
_PIECE = re.compile(r" +|[^\s]")            # a run of spaces, or one character


def _wide(char: str) -> bool:
    return unicodedata.east_asian_width(char) in "WF"


def cells(text: str) -> int:
    """Terminal columns taken by ``text``: 2 for a wide (Chinese) character, 1 otherwise."""
    return sum(2 if _wide(char) else 1 for char in text)


@dataclass
class _Unit:
    """Characters that stay on one line: text[start:end]; ``spaced``: a space comes before it."""

    start: int
    end: int
    spaced: bool


def _units(line: str) -> list[_Unit]:
    """Runs of narrow non-space characters and single wide characters, punctuation glued to its neighbour."""
    units: list[_Unit] = []
    spaced = False
    for match in _PIECE.finditer(line):
        char, start = match.group(), match.start()
        if char.startswith(" "):
            spaced = bool(units)
            continue
        last = units[-1] if units else None
        glued = last is not None and not spaced and (
            char in CLOSING                                       # closing mark stays with what it closes
            or line[last.end - 1] in OPENING                      # opening mark stays with what it opens
            or (not _wide(char) and not _wide(line[last.end - 1]) and line[last.end - 1] not in CLOSING))
        if glued:
            last.end = match.end()
        else:
            units.append(_Unit(start, match.end(), spaced))
        spaced = False
    return _joined_commands(line, units)


def _command_argument(word: str) -> bool:
    """A word after ``multihead SUBCOMMAND ARG`` that still belongs to the command: an option, a metavar
    (TOPIC, PATH) or anything with code punctuation (a file, an id)."""
    return word.startswith("-") or word.isupper() or any(mark in word for mark in "-_.:/=")


def _joined_commands(line: str, units: list[_Unit]) -> list[_Unit]:
    """``multihead SUBCOMMAND [ARG] [--option VALUE ...]`` joined into one unit (spaces inside)."""
    out: list[_Unit] = []
    index = 0
    while index < len(units):
        unit = units[index]
        words = [line[u.start:u.end] for u in units[index:index + 2]]
        if words[:1] == ["multihead"] and len(words) == 2 and words[1] in SUBCOMMANDS and units[index + 1].spaced:
            last = index + 1
            if last + 1 < len(units) and units[last + 1].spaced and not _wide(line[units[last + 1].start]):
                last += 1  # the first argument: a topic, a FILE.py:Class, an option
                while (last + 1 < len(units) and units[last + 1].spaced
                       and _command_argument(line[units[last + 1].start:units[last + 1].end])):
                    last += 1
            out.append(_Unit(unit.start, units[last].end, unit.spaced))
            index = last + 1
            continue
        out.append(unit)
        index += 1
    return out


def _greedy(line: str, start: int, end: int, cuts: list[int], widths: tuple[int, int]) -> list[int]:
    """Offsets that break line[start:end] at some of ``cuts``, as late as possible, so that the first line
    takes at most widths[0] cells and every other line widths[1] (a piece between two cuts that is wider
    still overflows)."""
    offsets, line_start, fitting = [], start, start
    for cut in [*cuts, end]:
        limit = widths[0] if not offsets else widths[1]
        if cells(line[line_start:cut].rstrip()) > limit and fitting > line_start:
            offsets.append(fitting)
            line_start = fitting
        fitting = cut
    return offsets


# where a piece too wide for a line may break: at its spaces; after "/" or ":" (a path) or an id's "-";
# between any two characters
FOLDS = (r"(?<= )(?=[^ ])", r"(?<=[/:])|(?<=[A-Za-z0-9]-)(?=[A-Za-z0-9])", r"(?<=.)")


def _cuts(line: str, start: int, end: int, width: int, level: int = 0) -> list[int]:
    """Where line[start:end] may break: at its spaces, and inside a piece still wider than ``width`` after
    "/", ":" or "-" (a path, an id), and inside a piece wider still, between any two characters."""
    found = [start + m.start() for m in re.finditer(FOLDS[level], line[start:end]) if 0 < m.start() < end - start]
    if level == len(FOLDS) - 1:  # still, a closing mark never starts a line, an opening one never ends one
        return [cut for cut in found if line[cut] not in CLOSING and line[cut - 1] not in OPENING]
    out: list[int] = []
    for a, b in zip([start, *found], [*found, end]):
        if a > start:
            out.append(a)
        if cells(line[a:b].rstrip()) > width:
            out += _cuts(line, a, b, width, level + 1)
    return out


def break_offsets(line: str, width: int) -> list[int]:
    """Where ``line`` (one line of text, no newline) breaks so that no line is wider than ``width`` cells:
    the offsets at which each following line starts (the spaces before a break stay on the line above,
    for the caller to strip)."""
    offsets: list[int] = []
    used = 0  # cells on the current line, up to the end of its last unit
    for unit in _units(line):
        gap = cells(line[len(line[:unit.start].rstrip(" ")):unit.start]) if used else cells(line[:unit.start])
        size = cells(line[unit.start:unit.end])
        if used and used + gap + size > width:
            offsets.append(unit.start)
            used, gap = 0, 0
        if used + gap + size <= width:
            used += gap + size
            continue
        cuts = _cuts(line, unit.start, unit.end, width)   # wider than a line by itself
        folded = _greedy(line, unit.start, unit.end, cuts, (width - used - gap, width))
        offsets += folded
        used = cells(line[folded[-1]:unit.end]) if folded else used + gap + size
    return offsets


def narrowest(text: str) -> int:
    """The narrowest width ``text`` wraps to without folding anything: its widest piece between spaces
    that must stay on one line (a table column holding it should not be narrower)."""
    widths = [cells(word) for line in text.split("\n") for unit in _units(line)
              for word in line[unit.start:unit.end].split(" ")]
    return max(widths, default=0)


def wrap(text: str, width: int) -> list[str]:
    """``text`` (one paragraph, or several separated by newlines) broken into lines of at most ``width``
    cells, each stripped of trailing spaces."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        cuts = [0, *break_offsets(paragraph, width), len(paragraph)]
        lines += [paragraph[a:b].rstrip() for a, b in zip(cuts, cuts[1:])]
    return lines
