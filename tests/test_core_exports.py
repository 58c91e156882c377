"""The public names of the contract exist, behave as names (not submodules), and import lightly."""
from __future__ import annotations

import subprocess
import sys

import multihead as mh

CONTRACT = ["attention", "dispatch", "Mask", "MultiHeadAttention", "capture_attention", "AttentionError",
            "check", "textbook", "merge_states"]


def test_every_contract_name_is_exported():
    for name in CONTRACT:
        assert hasattr(mh, name) and name in mh.__all__
    for ctor in ("keep", "block", "additive", "lengths", "key_padding", "causal"):
        assert callable(getattr(mh.Mask, ctor))
    assert callable(mh.MultiHeadAttention.from_module) and callable(mh.MultiHeadAttention.to_torch)


def test_check_is_a_function_and_its_subpackage_imports_normally():
    import multihead.checker.run as run  # the package is `checker`, so nothing shadows `mh.check`

    assert run.check is mh.check

    module = mh.textbook.ClassicTransformerHeads(16, 4)
    first, second = mh.check(module), mh.check(module)
    assert first.passed and second.passed and first.exit_code == 0


def test_import_pulls_in_no_cli_dependencies():
    code = "import sys, multihead; print(any(m in sys.modules for m in ('rich', 'matplotlib')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
