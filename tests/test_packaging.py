"""What an installed multihead promises its users' tools: type hints (py.typed) and `multihead --version`."""
from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import multihead as mh
from multihead import compat
from multihead.masks import mask as mask_module

ROOT = Path(__file__).resolve().parents[1]


def test_py_typed_marker_is_shipped():
    assert (Path(mh.__file__).parent / "py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "py.typed" in package_data["multihead"]


def test_public_functions_are_fully_annotated():
    public = [mh.attention, mh.dispatch, mh.capture_attention, mh.MultiHeadAttention.__init__,
              mh.MultiHeadAttention.forward, mh.MultiHeadAttention.new_cache, compat.MultiheadAttention.__init__,
              compat.MultiheadAttention.forward]
    for fn in public:
        signature = inspect.signature(fn)
        missing = [name for name, p in signature.parameters.items()
                   if name != "self" and p.annotation is inspect.Parameter.empty]
        assert not missing, f"{fn.__qualname__}: no annotation for {missing}"
        assert signature.return_annotation is not inspect.Signature.empty, f"{fn.__qualname__}: no return type"


def test_typed_mask_constructors_match_the_real_ones():
    """Mask's constructors are added by each kind's file; mask.py declares them for type checkers.
    The declarations must list every constructor with the same parameters and defaults."""
    tree = ast.parse(Path(mask_module.__file__).read_text())
    mask_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Mask")
    block = next(n for n in mask_class.body if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING")
    declared = {}
    for fn in block.body:
        args = fn.args
        defaults = [None] * (len(args.args) - len(args.defaults)) + [ast.literal_eval(d) for d in args.defaults]
        declared[fn.name] = [(a.arg, d) for a, d in zip(args.args[1:], defaults[1:])]
        assert all(a.annotation is not None for a in args.args[1:]) and fn.returns is not None, fn.name
    real = {name: [(p.name, None if p.default is p.empty else p.default)
                   for p in inspect.signature(getattr(mh.Mask, name)).parameters.values()]
            for name, value in vars(mh.Mask).items() if isinstance(value, classmethod)}
    assert declared == real


def test_version_flag():
    result = subprocess.run([sys.executable, "-m", "multihead", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == f"multihead {mh.__version__}"
