"""The held-out cases as learner files.

Most buggy cases are one mistake in a correct case. They are stored as that: `mutant_of` names the correct
case's file, and the case's recorded `fix` (buggy text -> correct text) is undone on it. So each mistake is
written once, as the edit it is, and the file a learner would have is rebuilt from it, byte for byte.

    case_source(case) -> str          the learner's file
    write_cases(cases, folder) -> Path  every case's file under folder, named as in the manifest

Each takes `stored`, the folder that holds the correct files (default: this zoo's cases/), so that another
held-out zoo with the same layout uses the same writer.
"""
from __future__ import annotations

from pathlib import Path

CASES = Path(__file__).resolve().parent / "cases"


def _replace_once(source: str, old: str, new: str, name: str) -> str:
    if source.count(old) != 1:
        raise ValueError(f"{name}: the text occurs {source.count(old)} times, expected once: {old!r}")
    return source.replace(old, new)


def case_source(case: dict, stored: Path = CASES) -> str:
    """The case's file as the learner wrote it: its own file, or its correct sibling with the fix undone."""
    if "mutant_of" not in case:
        return (stored / case["file"]).read_text(encoding="utf-8")
    source = (stored / case["mutant_of"]).read_text(encoding="utf-8")
    for old, new in case["fix"]:
        source = _replace_once(source, new, old, case["name"])
    return source


def fixed_source(case: dict, stored: Path = CASES) -> str:
    """The case's file with its recorded fix applied."""
    source = case_source(case, stored)
    for old, new in case["fix"]:
        source = _replace_once(source, old, new, case["name"])
    return source


def write_cases(cases: list[dict], folder: Path, stored: Path = CASES) -> Path:
    """Every case's learner file written under folder (named as in the manifest); returns folder."""
    folder.mkdir(parents=True, exist_ok=True)
    for case in cases:
        (folder / case["file"]).write_text(case_source(case, stored), encoding="utf-8")
    return folder
