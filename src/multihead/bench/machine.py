"""What the numbers were measured on: CPU and its vector ISA, the decode kernel's path, threads, torch, date
and load."""
from __future__ import annotations

import datetime
import os
import platform

import torch

from multihead.backends.cpu import build as decode_build
from multihead.bench.timing import clock

# the CPU features that decide which path the C++ decode kernel builds (x86: "flags", ARM: "Features")
ISA_FLAGS = ("avx512f", "avx512_bf16", "avx2", "fma", "asimd", "sve", "neon")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def cpu_flags(cpuinfo: str | None = None) -> str:
    """The ISA_FLAGS the CPU has, space-separated, from /proc/cpuinfo (or the text `cpuinfo`); "" where
    there is none to read."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:
            return ""
    listed = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                   if line.split(":", 1)[0].strip() in ("flags", "Features")), [])
    return " ".join(flag for flag in ISA_FLAGS if flag in listed)


def decode_isa() -> str | None:
    """The path the loaded C++ decode kernel runs ("avx512-bf16", "avx2", "portable" ...), as its build says;
    None when this process loaded none (no build is started here) or the build does not say."""
    module = decode_build.loaded()
    report = getattr(module, "isa", None)
    return report() if callable(report) else None


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages, or None where the OS has none."""
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


def describe() -> dict:
    """A JSON-ready description of this machine and this run."""
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "decode_isa": decode_isa(),
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": load_average(),
        "clock": clock(),
    }
