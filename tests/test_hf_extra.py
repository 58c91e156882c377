"""The `hf` extra: transformers alone runs the Hugging Face plug-in (nothing from the models extra's other packages)."""
from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OTHERS = ("tokenizers", "safetensors", "peft", "onnx", "onnxruntime", "onnxscript")  # the models extra, beyond it

SCRIPT = """
import sys
import multihead.hf
print(" ".join(sorted(m.__file__ for name, m in list(sys.modules.items())
                      if name.split(".")[0] == "multihead" and getattr(m, "__file__", None))))
"""


def test_the_hf_extra_is_transformers_alone():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [req.split(">")[0] for req in extras["hf"]] == ["transformers"]
    assert extras["hf"][0] in extras["models"]


def test_no_module_the_plugin_loads_imports_a_package_of_the_models_extra_beyond_transformers():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600,
                          env={"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    files = done.stdout.split()
    assert any(f.endswith("hf/paged.py") for f in files) and any(f.endswith("hf/quantized.py") for f in files)
    for path in files:
        for node in ast.walk(ast.parse(Path(path).read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.split(".")[0] in OTHERS], f"{path} imports {names}"
