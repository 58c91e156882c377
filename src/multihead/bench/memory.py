"""Peak memory: each configuration runs in a fresh Python process that reports its own peak RSS.

A fresh process is the only honest way on CPU: the allocator keeps freed pages, so one process
measuring several configurations would report the largest of them every time after that.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import asdict

import torch

from multihead.bench.peers import Shape
from multihead.bench.timing import clock

GIB = 1024**3


def status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status in bytes (VmRSS now, VmHWM the peak); None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    return None


def score_tensor_bytes(shape: Shape) -> int:
    """Bytes of one (B, H, N, N) float32 score tensor: 4 * B * H * N^2."""
    return 4 * shape.batch * shape.heads * shape.length**2


def probe(impl: str, shape: Shape, *, repeats: int = 1, warmup: int = 0,
          timeout_s: float = 600.0) -> dict:
    """Build `impl` for `shape` in a fresh process; run `warmup` then `repeats` timed forward passes.

    Returns {"seconds": median seconds per pass, "peak_rss": bytes, "setup_rss": bytes after the
    module and input were built} or {"error": why} when the process failed or ran out of time.
    """
    spec = {**asdict(shape), "dtype": str(shape.dtype).split(".")[-1]}
    spec.update(impl=impl, repeats=repeats, warmup=warmup, clock=clock(), threads=torch.get_num_threads())
    cmd = [sys.executable, "-m", "multihead.bench.probe", json.dumps(spec)]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"error": f"ran past {timeout_s:.0f} s"}
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit code {done.returncode}: {tail}"}
    return json.loads(done.stdout.strip().splitlines()[-1])
