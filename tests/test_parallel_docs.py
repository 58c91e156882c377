"""docs/parallel.md cannot drift: its quick start runs on two processes, its projection is recomputed."""
from __future__ import annotations

import re
from pathlib import Path

from multihead.parallel import projection
from multihead.parallel.launch import run_local
from parallel_cases import run_code

DOC = (Path(__file__).resolve().parents[1] / "docs" / "parallel.md").read_text()


def test_quick_start_runs_on_two_processes():
    section = DOC.split("## Quick start", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    assert run_local(run_code, 2, code, timeout_s=90) == ["ran", "ran"]


def test_projection_table_is_what_the_model_computes():
    assert projection.table() in DOC


def test_every_file_the_doc_lists_exists():
    root = Path(__file__).resolve().parents[1] / "src" / "multihead"
    for name in re.findall(r"`(parallel/\w+\.py)`", DOC):
        assert (root / name).is_file(), name
