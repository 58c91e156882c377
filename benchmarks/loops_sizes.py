"""`multihead bench --suite loops` at chosen sizes (the suite's full sizes take hours on a busy 2-core machine).

    python benchmarks/loops_sizes.py --prompts 4096 --dtypes bf16 fp32 --requests 8 --latent 2048 \
        --json benchmarks/loops.json --markdown benchmarks/loops-results.md

Runs src/multihead/bench/suites/loops.py with these Sizes on one thread, CPU clock, and writes the same JSON line
and Markdown tables as the bench command (machine, ISA, decode kernel build and load included).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from multihead.bench import machine, report
from multihead.bench.progress import Bars
from multihead.bench.suites import loops, loops_attention
from multihead.bench.suites.context import Context
from multihead.bench.timing import set_clock


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--prompts", type=int, nargs="+", default=[4096])
    p.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"])
    p.add_argument("--no-compile", action="store_true")
    p.add_argument("--requests", type=int, nargs="*", default=[8])
    p.add_argument("--new", type=int, default=16)
    p.add_argument("--latent", type=int, default=4096, help="DeepSeek V3 prompt (0: skip)")
    p.add_argument("--keys", type=int, default=32768)
    p.add_argument("--listed", type=int, default=1024)
    p.add_argument("--prefill", nargs="*", default=["2048:64"], help="queries:listed keys each")
    p.add_argument("--quant-prompt", type=int, default=4096)
    p.add_argument("--no-attention", action="store_true", help="skip sparse decode, sparse prefill, quantized")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--json", default="benchmarks/loops.json")
    p.add_argument("--markdown", default="benchmarks/loops-results.md")
    a = p.parse_args()
    torch.set_num_threads(1)
    set_clock("cpu")
    prefill = tuple(tuple(int(x) for x in s.split(":")) for s in a.prefill)
    sizes = loops.Sizes(prompts=tuple(a.prompts), dtypes=tuple(a.dtypes), compiled=not a.no_compile,
                        batch_requests=tuple(a.requests), batch_new=a.new, latent_prompt=a.latent,
                        attention=None if a.no_attention else loops_attention.Sizes(
                            keys=a.keys, listed=a.listed, prefill=prefill, prompt=a.quant_prompt))
    started, load = time.perf_counter(), machine.load_average()
    with Bars(enabled=True) as bars:
        result = loops.run(Context(bars=bars, rounds=a.rounds, budget_s=60.0), sizes)
    info = {**machine.describe(), "load_average_at_start": load, "seconds": round(time.perf_counter() - started, 1),
            "sizes": repr(sizes)}
    report.print_rich([result], info)
    Path(a.json).write_text(report.json_line([result], info) + "\n")
    Path(a.markdown).write_text(report.markdown([result]))


if __name__ == "__main__":
    main()
