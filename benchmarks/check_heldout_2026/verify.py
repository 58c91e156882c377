"""Verify the 2026 held-out zoo without `multihead check`: every case marked PASS equals the float64
reference on its own weights; every buggy case differs from it (or raises), and the same file with its
recorded fix applied equals it. The machinery is the older held-out zoo's (benchmarks/check_heldout/:
reference.py, verify.py, zoo_files.py); this zoo brings its manifest, its cases, its readers (idioms.py)
and its call styles (calls.py).

    python benchmarks/check_heldout_2026/verify.py [NAME ...]
"""
from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
OLDER = HERE.parent / "check_heldout"
sys.path[:0] = [str(OLDER), str(HERE)]  # the older zoo's modules first: its verify, not this file

import verify as older  # noqa: E402
from calls import run_calls  # noqa: E402
from idioms import READERS  # noqa: E402

MANIFEST = HERE / "manifest.toml"
CASES = HERE / "cases"


def load_manifest() -> list[dict]:
    """The cases, in manifest order."""
    return older.load_manifest(MANIFEST)


def verify(case: dict, folder: Path) -> tuple[bool, str]:
    """Whether the case is what the manifest says, and the measured errors."""
    return older.verify(case, folder, CASES, READERS, run_calls)


def main(names: list[str]) -> int:
    return older.main(names, MANIFEST, CASES, READERS, run_calls)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
