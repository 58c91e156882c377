"""Building and loading the C++ decode kernel (decode_kernel.cpp, with its row loops in decode_rows.h,
its vector tiles in decode_simd.h and the MLA products in latent_products.h) with torch's extension tooling.

The kernel is compiled on first use for the host CPU (the "native" build, `-march=native`) into a cache
folder beside the Python environment, one per build, source, torch version and CPU. torch's builder holds
a file lock there, so parallel processes build it once. `make run` and `make test` build it at install
time (`build_now()`). The preprocessor picks the kernel's path from the target: AVX-512 (with
`vdpbf16ps` where AVX512-BF16 is there), AVX2 with FMA, or plain C++ the compiler vectorises (NEON on
ARM, SSE2 on a bare x86-64); the module's `isa()` names the one it was built with.

BUILDS also names the builds the tests make beside the native one, so that every path is compiled and
checked on one machine: "x86-64-v3" (AVX2 + FMA) and "portable" (no -march on ARM and other CPUs;
plain x86-64, SSE2, on x86).

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

from multihead.backends.cpu.calls import Kernel

HERE = Path(__file__).parent
SOURCES = tuple(HERE / name for name in ("decode_kernel.cpp",))  # the extension's C++ sources (one module)
HEADERS = tuple(HERE / name for name in ("decode_head.h", "decode_listed.h", "decode_rows.h", "decode_simd.h",
                                         "decode_tiles.h", "latent_products.h", "nan_rows.h", "decode_quant.h",
                                         "decode_paged.h", "decode_pass.h"))  # in the key with the sources
COMMON_FLAGS = ["-O3", "-fopenmp-simd", "-fno-math-errno", "-std=c++20"]
X86 = platform.machine().lower() in ("x86_64", "amd64")
BUILDS = {  # build name -> its target flags
    "native": ["-march=native"],
    **({"x86-64-v3": ["-march=x86-64-v3"]} if X86 else {}),  # AVX2 + FMA: the AVX2 path
    "portable": ["-march=x86-64", "-mtune=generic"] if X86 else [],  # the plain C++ path
}
NEEDS = {"x86-64-v3": ("avx2", "fma", "f16c", "bmi1", "bmi2", "movbe", "abm")}  # CPU flags a build's code uses
NATIVE = "native"
DISABLE = "MULTIHEAD_DECODE_KERNEL"
_state: dict[str, object] = {}  # "module" and "why": the native build's one attempt per process
_others: dict[str, tuple[object, str | None]] = {}  # the other builds: name -> (module, why)


def flags(build: str = NATIVE) -> list[str]:
    """The compiler flags of `build` (a name in BUILDS)."""
    return [*COMMON_FLAGS, *BUILDS[build]]


def build_dir(build: str = NATIVE) -> Path:
    """MULTIHEAD_BUILD_DIR, else <sys.prefix>/var/multihead/<tag>: one folder per build, its sources and
    headers, torch and CPU."""
    root = os.environ.get("MULTIHEAD_BUILD_DIR")
    tag = hashlib.sha256(
        b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
        + " ".join([torch.__version__, platform.machine(), cpu_flags(), *flags(build)]).encode()
    ).hexdigest()[:16]
    base = Path(root) if root else Path(sys.prefix) / "var" / "multihead"
    return base / ("decode-" + tag if build == NATIVE else f"decode-{build}-{tag}")


def cpu_flags() -> str:
    """The host CPU's feature flags as Linux lists them ("flags" on x86, "Features" on ARM), else
    platform.processor(): in the build's key, so that a build for one CPU is not loaded on another."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def runs_here(build: str) -> bool:
    """Whether the code of `build` (a name in BUILDS) runs on this CPU: the native and portable builds
    always; x86-64-v3 where the CPU lists the flags its code uses (NEEDS)."""
    have = set(cpu_flags().split())
    return build in BUILDS and all(flag in have for flag in NEEDS.get(build, ()))


def kernel() -> Kernel | None:
    """The native build (a decode_calls.Kernel: `decode_step`, `latent_product`, `isa`), built on first
    call; None when it cannot be had."""
    if "why" not in _state:
        _state["module"], _state["why"] = _load(NATIVE)
    return _state["module"]


def loaded() -> Kernel | None:
    """The native build if an earlier call built or loaded it, else None; never builds (safe under torch.compile)."""
    return _state.get("module")


def unavailable() -> str | None:
    """Why the C++ kernel is not used (None: it is)."""
    kernel()
    return _state["why"]  # type: ignore[return-value]


def isa() -> str | None:
    """The path the native build runs ("avx512-bf16", "avx512", "avx2", "portable"); None without one."""
    module = kernel()
    return None if module is None else module.isa()


def variant(build: str) -> tuple[Kernel | None, str | None]:
    """(kernel, None) for the build called `build` (a name in BUILDS), built on first call, or (None, why)."""
    if build == NATIVE:
        return kernel(), unavailable()
    if build not in _others:
        _others[build] = _load(build)
    return _others[build]


def _load(build: str):
    if os.environ.get(DISABLE, "1") == "0":
        return None, f"the C++ decode kernel is switched off ({DISABLE}=0)"
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return None, "no C++ compiler on this machine to build the decode kernel"
    if shutil.which("ninja") is None:
        return None, "no ninja on the PATH, which torch's extension builder needs for the decode kernel"
    # torch's builder imports setuptools (0.2 s): loaded here, only in a process that uses the kernel
    cpp_extension = importlib.import_module("torch.utils.cpp_extension")
    folder = build_dir(build)
    name = "multihead_decode_" + folder.name.rsplit("-", 1)[1] + ("" if build == NATIVE else "_" + build.replace("-", "_"))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        module = cpp_extension.load(name=name, sources=[str(path) for path in SOURCES], extra_cflags=flags(build),
                                    build_directory=str(folder), verbose=False)
    except Exception as e:  # noqa: BLE001 (any build failure means: use the plain-torch form)
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return None, f"the C++ decode kernel ({build} build) failed to build ({first[:200]})"
    return Kernel(module), None


def build_now() -> str:
    """Build (or load) the kernel now and say where it is or why there is none: `make run` and `make test`
    call this once, so that no test pays for the build."""
    kernel()
    why = unavailable()
    return f"decode kernel: {why or f'built in {build_dir()} ({isa()} path)'}"
