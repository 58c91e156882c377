"""docs/mla.md runs as written: its code blocks, in order, as one script, printing what it promises."""
from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.models
pytest.importorskip("transformers")

DOC = Path(__file__).resolve().parents[1] / "docs" / "mla.md"


def test_the_doc_runs_and_every_comparison_holds():
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)
    assert len(blocks) == 4
    namespace: dict = {"__name__": "mla_doc"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in blocks:
            exec(compile(block, str(DOC), "exec"), namespace)
    lines = printed.getvalue().splitlines()
    assert lines == ["torch.Size([2, 16, 16]) torch.Size([2, 16, 4]) [9, 9]", "tensor(True) tensor(True)", "True",
                     "[0, -1, -1] [1, 2, 3, 3, 3, 3, 3, 3, 3] (2, 16, 8)", "tensor(True)",
                     "sliding 0.0 tensor(True)", "heavily_compressed 32.0 tensor(True)",
                     "compressed_sparse 96.0 tensor(True)"]
