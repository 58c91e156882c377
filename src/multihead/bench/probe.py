"""Run inside a fresh process by `memory.probe`: build one implementation, time it, report peak RSS.

Usage: python -m multihead.bench.probe '{"impl": "ours", "batch": 1, "length": 4096, ...}'
Prints one JSON line: {"seconds": ..., "peak_rss": ..., "setup_rss": ...}.
"""
from __future__ import annotations

import json
import statistics
import sys

import torch

from multihead.bench.memory import status_bytes
from multihead.bench.peers import Shape
from multihead.bench.registry import build
from multihead.bench.timing import set_clock, set_threads, time_call


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    impl, repeats, warmup = spec.pop("impl"), spec.pop("repeats"), spec.pop("warmup")
    set_clock(spec.pop("clock", "wall"))
    set_threads(spec.pop("threads", None))
    spec["dtype"] = getattr(torch, spec["dtype"])
    runner = build(impl, Shape(**spec))
    setup_rss = status_bytes("VmRSS")
    for _ in range(warmup):
        runner.forward()
    seconds = [time_call(runner.forward) for _ in range(repeats)]
    print(json.dumps({
        "seconds": statistics.median(seconds),
        "peak_rss": status_bytes("VmHWM"),
        "setup_rss": setup_rss,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
