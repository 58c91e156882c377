"""docs/architecture.md's walk of a mask is the code's: the call it describes is traced (every function of the
package it enters, in order) and the files and folders it passes through must be the ones the doc shows.

When the hot path changes on purpose, regenerate the doc's block instead of editing it:
    PYTHONPATH=src python tests/test_docs_architecture.py --write
"""
from __future__ import annotations

import re
import sys
import textwrap
from pathlib import Path

import torch

import multihead as mh

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
BLOCK = re.compile(r"(^```text walk\n)(.*?)(^```$)", flags=re.S | re.M)
PACKAGE = str(Path(mh.__file__).parent) + "/"


def traced(call) -> list[str]:
    """The package's files `call()` enters, in order, each run of calls in one file once."""
    files: list[str] = []

    def enter(frame, event, arg):
        name = frame.f_code.co_filename
        if event == "call" and name.startswith(PACKAGE):
            name = name[len(PACKAGE):]
            if not files or files[-1] != name:
                files.append(name)

    sys.setprofile(enter)
    try:
        call()
    finally:
        sys.setprofile(None)
    return files


def folders(files: list[str]) -> list[str]:
    """The folders in the order the files are entered, each run once; the package root is "root"."""
    named = [f.split("/")[0] + "/" if "/" in f else "root" for f in files]
    return [f for i, f in enumerate(named) if i == 0 or named[i - 1] != f]


def describe(label: str, files: list[str]) -> list[str]:
    passed = folders(files)
    return [f"{label}: {len(dict.fromkeys(files))} files, {len(set(passed))} folders, {len(passed) - 1} crossings",
            *textwrap.wrap(", ".join(dict.fromkeys(files)), 108, initial_indent="  files:   ",
                           subsequent_indent=" " * 11, break_on_hyphens=False),
            *textwrap.wrap(" -> ".join(passed), 108, initial_indent="  folders: ", subsequent_indent=" " * 11,
                           break_on_hyphens=False)]


def walk() -> str:
    """The doc's call, traced the first time and again: what the block shows."""
    torch.manual_seed(0)
    attn = mh.MultiHeadAttention(64, 8, window=4).eval()
    x = torch.randn(2, 10, 64)  # (B, L, E)
    mask = mh.Mask.key_padding(torch.tensor([[False] * 10, [False] * 6 + [True] * 4]))  # a tensor no plan has seen

    def call():
        with torch.no_grad():
            attn(x, mask=mask, causal=True)

    first, again = traced(call), traced(call)
    return "\n".join(describe("the first call", first) + describe("the same call again", again)) + "\n"


def test_the_doc_shows_the_walk_the_code_takes():
    (shown,) = [m[2] for m in BLOCK.finditer(DOC.read_text())]
    assert shown == walk(), "regenerate with: PYTHONPATH=src python tests/test_docs_architecture.py --write"
    (counted,) = re.findall(r"the mask's way crosses (\d+) folders", DOC.read_text())
    assert f"{counted} folders" in shown.splitlines()[0], "the prose counts other folders than the trace"


def test_the_walk_starts_in_the_module_and_ends_in_a_backend():
    files = traced(lambda: mh.MultiHeadAttention(16, 2)(torch.randn(1, 3, 16)))
    assert files[0] == "layers/multi_head.py" and "attention.py" in files and "backends/sdpa.py" in files


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    text = DOC.read_text()
    DOC.write_text(BLOCK.sub(lambda m: m[1] + walk() + m[3], text, count=1))
    print("docs/architecture.md:", "updated" if DOC.read_text() != text else "unchanged")
