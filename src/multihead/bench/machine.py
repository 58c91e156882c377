"""What the numbers were measured on: CPU, threads, torch, date and load."""
from __future__ import annotations

import datetime
import os
import platform

import torch

from multihead.bench.timing import clock


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
        "cores": os.cpu_count(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average": load_average(),
        "clock": clock(),
    }
