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


def test_mask_constructors_are_plain_annotated_class_methods_of_mask():
    """Each constructor is defined in Mask's own class body (no attribute added from outside), typed."""
    tree = ast.parse(Path(mask_module.__file__).read_text())
    mask_class = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Mask")
    defined = {fn.name: fn for fn in mask_class.body if isinstance(fn, ast.FunctionDef)
               and any(ast.unparse(d) == "classmethod" for d in fn.decorator_list)}
    real = {name for name, value in vars(mh.Mask).items() if isinstance(value, classmethod)}
    assert real == set(defined) and {"keep", "block", "lengths", "causal", "window", "alibi"} <= real
    for name, fn in defined.items():
        assert all(a.annotation is not None for a in fn.args.args[1:]) and fn.returns is not None, name
    assert not any(isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test) for n in mask_class.body)


def test_version_flag():
    result = subprocess.run([sys.executable, "-m", "multihead", "--version"], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == f"multihead {mh.__version__}"
