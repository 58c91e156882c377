"""One mutant of the check zoo: a correct module (zoo_modules.CORRECT) with one classic bug injected by textual
edits, and how its file is written next to a test.

``write_mutant`` applies a mutant's edits and refuses an edit that would do nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from zoo_modules import CORRECT, ZOO


@dataclass(frozen=True)
class Mutant:
    target: str  # a key of CORRECT
    bug: str  # the id the checker must name
    edits: tuple[tuple[str, str], ...]  # (old, new), every old must occur
    note: str = ""  # what the edit does, when the id alone does not say
    options: dict = field(default_factory=dict, hash=False)

    @property
    def name(self) -> str:
        return f"{self.target.split(':')[0][3:-3]}-{self.bug}{'-' + self.note if self.note else ''}"


def mutant(target, bug, *edits, note=""):
    """A Mutant of zoo module `target` (a key of CORRECT, whose options it takes) named by `bug`."""
    return Mutant(target, bug, tuple(edits), note, CORRECT[target])


def target_path(target: str, folder: Path | None = None) -> str:
    """"file.py:Class" (a CORRECT key, whose optional " label" is dropped) as a path into the zoo or ``folder``."""
    file_name, class_name = target.split(" ")[0].split(":")
    return f"{(folder or ZOO) / file_name}:{class_name}"


def write_mutant(folder: Path, mutant: Mutant) -> str:
    """Write the mutant's file into ``folder`` and return its "path.py:Class" target."""
    file_name, class_name = mutant.target.split(" ")[0].split(":")
    text = (ZOO / file_name).read_text()
    for old, new in mutant.edits:
        assert old in text, f"{old!r} is not in {file_name}"
        text = text.replace(old, new)
    path = Path(folder) / f"{mutant.name}.py"
    path.write_text(text)
    return f"{path}:{class_name}"
