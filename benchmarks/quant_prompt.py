"""The prompt step with a quantized KV cache against the same step with a float cache, interleaved A/B in one
process, one thread, fp32 model, no grad (issue 33: int8 prompt at most 1.1x the float cache's).

    PYTHONPATH=src python benchmarks/quant_prompt.py [--rounds 15] [--tokens 2048] [--json benchmarks/quant-prompt.json]

Per embed width E (512 and 1024; H = 8 heads, causal): a MultiHeadAttention forward over a prompt of `tokens`
tokens into an empty cache of each kind (float32, int8, fp8 e4m3), and with no cache. Each round times every
row once, in turn (a fresh cache each time, made outside the timing); the figure is the median of the rounds'
wall seconds and the ratio the median of the per-round ratios to the float cache. The dispatch decision of
the int8 prompt is recorded too.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

import multihead as mh
from multihead.bench.machine import describe

KINDS = {"float cache": None, "int8 cache": torch.int8, "fp8 e4m3 cache": torch.float8_e4m3fn}


def prompt(module, x, kv_dtype, kind: str):
    """A function timing one prompt step (seconds): with a fresh cache of `kv_dtype`, or with none."""
    def run() -> float:
        cache = None if kind == "no cache" else module.new_cache(1, x.shape[1], kv_dtype=kv_dtype)
        start = time.perf_counter()
        module(x, cache=cache)
        return time.perf_counter() - start
    return run


def measure(E: int, tokens: int, rounds: int) -> dict:
    torch.manual_seed(0)
    module = mh.MultiHeadAttention(E, 8, causal=True).eval()
    x = torch.randn(1, tokens, E)
    rows = {name: prompt(module, x, kv, name) for name, kv in KINDS.items()}
    rows["no cache"] = prompt(module, x, None, "no cache")
    with torch.no_grad():
        for run in rows.values():
            run()  # warm-up (plans, allocations)
        times = {name: [] for name in rows}
        for _ in range(rounds):
            for name, run in rows.items():
                times[name].append(run())
        cache = module.new_cache(1, tokens, kv_dtype=torch.int8)
        q = torch.randn(1, 8, tokens, E // 8)
        k, v, mask = cache.append(torch.randn(1, 8, tokens, E // 8), torch.randn(1, 8, tokens, E // 8))
        decision = str(mh.dispatch(q, k, v, mask)).splitlines()[0]
    base = times["float cache"]
    return {"E": E, "heads": 8, "tokens": tokens,
            "seconds": {name: statistics.median(t) for name, t in times.items()},
            "ratio to float cache": {name: statistics.median(a / b for a, b in zip(t, base))
                                     for name, t in times.items()},
            "int8 prompt dispatch": decision}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = [measure(E, args.tokens, args.rounds) for E in (512, 1024)]
    for r in results:
        cells = ", ".join(f"{name} {r['seconds'][name] * 1e3:.1f} ms ({r['ratio to float cache'][name]:.2f}x)"
                          for name in r["seconds"])
        print(f"E={r['E']}: {cells}\n  {r['int8 prompt dispatch']}")
    report = {"machine": describe(), "threads": 1, "rounds": args.rounds, "goal": "int8 cache <= 1.1x float cache",
              "results": results}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report))


if __name__ == "__main__":
    main()
