"""Building and loading the C++ decode kernel (decode_kernel.cpp, with its row loops in decode_rows.h
and its AVX-512 tiles in decode_simd.h) with torch's extension tooling.

The kernel is compiled on first use for the host CPU (`-march=native`: AVX-512 or AVX2 where the CPU
has them) into a cache folder beside the Python environment, one per source, torch version and CPU.
torch's builder holds a file lock there, so parallel processes build it once. `make run` and
`make test` build it at install time (`build_now()`).

When there is no compiler, or the build fails, `kernel()` returns None and `unavailable()` says why;
the decode backend then runs its plain-torch form. MULTIHEAD_DECODE_KERNEL=0 forces that (tests).
"""
from __future__ import annotations

import hashlib
import importlib
import os
import platform
import shutil
import sys
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("decode_kernel.cpp")
HEADERS = tuple(Path(__file__).with_name(name)  # in the key
                for name in ("decode_rows.h", "decode_simd.h", "latent_products.h", "nan_rows.h"))
FLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-std=c++17"]
DISABLE = "MULTIHEAD_DECODE_KERNEL"
_state: dict[str, object] = {}  # "module" and "why": the outcome of the one attempt per process


def build_dir() -> Path:
    """MULTIHEAD_BUILD_DIR, else <sys.prefix>/var/multihead/<tag>: one folder per source (and headers),
    torch and CPU."""
    root = os.environ.get("MULTIHEAD_BUILD_DIR")
    tag = hashlib.sha256(
        b"".join(path.read_bytes() for path in (SOURCE, *HEADERS))
        + " ".join([torch.__version__, platform.machine(), _cpu_flags(), *FLAGS]).encode()
    ).hexdigest()[:16]
    base = Path(root) if root else Path(sys.prefix) / "var" / "multihead"
    return base / f"decode-{tag}"


def _cpu_flags() -> str:
    """The host CPU's feature flags (Linux), so a cache built for one CPU is not loaded on another."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def kernel():
    """The compiled module (its `decode_step`), built on first call; None when it cannot be had."""
    if "why" not in _state:
        _state["module"], _state["why"] = _load()
    return _state["module"]


def loaded():
    """The module if an earlier call built or loaded it, else None; never builds (safe under torch.compile)."""
    return _state.get("module")


def unavailable() -> str | None:
    """Why the C++ kernel is not used (None: it is)."""
    kernel()
    return _state["why"]  # type: ignore[return-value]


def _load():
    if os.environ.get(DISABLE, "1") == "0":
        return None, f"the C++ decode kernel is switched off ({DISABLE}=0)"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return None, "no C++ compiler on this machine to build the decode kernel"
    if shutil.which("ninja") is None:
        return None, "no ninja on the PATH, which torch's extension builder needs for the decode kernel"


    # torch's builder imports setuptools (0.2 s): loaded here, only in a process that uses the kernel
    cpp_extension = importlib.import_module("torch.utils.cpp_extension")
    folder = build_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        module = cpp_extension.load(name=f"multihead_decode_{folder.name[7:]}", sources=[str(SOURCE)],
                                    extra_cflags=FLAGS, build_directory=str(folder), verbose=False)
    except Exception as e:  # noqa: BLE001 (any build failure means: use the plain-torch form)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"the C++ decode kernel failed to build ({first[:200]})"
    return module, None


def build_now() -> str:
    """Build (or load) the kernel now and say where it is or why there is none: `make run` and `make test`
    call this once, so that no test pays for the build."""
    kernel()
    return f"decode kernel: {unavailable() or 'built in ' + str(build_dir())}"
