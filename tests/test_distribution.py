"""The built distributions hold the whole package: an sdist, a wheel built from that sdist, and the
README quick start run from the wheel installed in a fresh virtual environment.

Offline: setuptools' build hooks run in this interpreter (no build isolation, nothing downloaded),
pip installs the wheel with --no-index --no-deps, and the fresh environment reuses this one's torch
through a path file instead of installing it. What it proves: the package data (the explain word
files, py.typed) and every module ship, and `import multihead` works from the installed files alone.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch

from test_readme_code import blocks

pytestmark = pytest.mark.slow
setuptools = pytest.importorskip("setuptools")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "multihead"
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                  ".hypothesis", "out", ".whl")
BUILD = "import sys; from setuptools import build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"


def run(*command, cwd: Path | None = None) -> str:
    """Run `command` without this session's PYTHONPATH (which points at src/); its stdout, or fail with its output."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def package_files() -> set[str]:
    """Every file of the package in the source tree, as `multihead/...` paths (no bytecode)."""
    return {f"multihead/{p.relative_to(PACKAGE).as_posix()}" for p in PACKAGE.rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """{"sdist": path, "wheel": path}: the sdist of a clean copy of the tree, then the wheel built from it."""
    tmp = tmp_path_factory.mktemp("dist")
    tree, out = tmp / "tree", tmp / "out"
    shutil.copytree(ROOT, tree, ignore=LEFT_OUT)
    out.mkdir()
    sdist = out / run(sys.executable, "-c", BUILD, "build_sdist", out, cwd=tree).strip().splitlines()[-1]
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp / "unpacked", filter="data")
    (unpacked,) = (tmp / "unpacked").iterdir()
    wheel = out / run(sys.executable, "-c", BUILD, "build_wheel", out, cwd=unpacked).strip().splitlines()[-1]
    return {"sdist": sdist, "wheel": wheel, "tmp": tmp}


def test_the_sdist_holds_the_package_and_what_building_needs(built):
    with tarfile.open(built["sdist"]) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md"} <= names
    missing = {f"src/{name}" for name in package_files()} - names
    assert not missing, f"not in the sdist: {sorted(missing)}"


def test_the_wheel_holds_every_module_and_the_package_data(built):
    with zipfile.ZipFile(built["wheel"]) as archive:
        names = set(archive.namelist())
    missing = package_files() - names
    assert not missing, f"not in the wheel: {sorted(missing)}"
    assert {"multihead/py.typed", "multihead/explain/words/en.json", "multihead/explain/words/zh.json"} <= names


def test_the_readme_quick_start_runs_from_the_wheel_in_a_fresh_environment(built):
    venv = built["tmp"] / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-index", "--no-deps", built["wheel"])
    site = Path(run(python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])").strip())
    torch_home = Path(torch.__file__).resolve().parents[1]  # reuse this environment's torch: nothing downloaded
    (site / "zz_reuse_torch.pth").write_text(f"{torch_home}\n")  # after the venv's own site-packages
    (quick_start,) = [b for b in blocks("README.md") if b.kind == "python" and "Quick start" in _heading(b)]
    code = "\n".join(quick_start.lines((ROOT / "README.md").read_text().splitlines()))
    check = (
        "import multihead, pathlib, sys\n"
        "home = pathlib.Path(multihead.__file__).resolve().parent\n"
        f"assert home.is_relative_to(pathlib.Path({str(venv.resolve())!r})), home\n"
        "for data in ('py.typed', 'explain/words/en.json', 'explain/words/zh.json'):\n"
        "    assert (home / data).is_file(), data\n"
        "from multihead.explain.words import words\n"
        "assert words('en') and words('zh')\n"
        "print('installed at', home)\n"
    )
    out = run(python, "-c", check + code, cwd=built["tmp"])
    assert "installed at" in out and "torch.Size([2, 8, 10, 10])" in out
    assert run(venv / "bin" / "multihead", "--version").strip().startswith("multihead ")


def _heading(block) -> str:
    """The last `## ` heading above `block` in its document."""
    lines = (ROOT / block.doc).read_text().splitlines()[:block.first]
    return next((line for line in reversed(lines) if line.startswith("## ")), "")
