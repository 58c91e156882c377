"""The core seam's overheads, interleaved A/B in one process (issue 25's goals), one thread, fp32, no grad.

    PYTHONPATH=src python benchmarks/core_seam.py [--rounds 15] [--calls 200] [--json benchmarks/core-seam.json]
    PYTHONPATH=src python benchmarks/core_seam.py --breakdown [--json benchmarks/core-seam-breakdown.json]

Rows (median microseconds of this thread's CPU time per call over rounds; each round times every row
once, in turn; the ratio is the median of the per-round ratios):
- small causal / key padding: mh.attention at B=1, H=12, L=8, D=64 against raw SDPA with the same mask;
- window module: MultiHeadAttention(64, 8, window=16) forward against the same module given a reused Mask;
- window decode: one decode step through a KVCache of 2048 keys with window=16, against a plain step over 64
  (each step at the same cache length: the plan cache's hit);
- growing decode: the window step with its cache growing by one token a step (each step a new key length: the
  decode plan serves every length, and makes the rows' intervals again), against the window step at a fixed length.
Prints a table, then one JSON line. --breakdown: the small causal call built up from raw SDPA one layer at a
time instead (each layer timed whole, interleaved the same way; a step is the difference of two medians, so
noise of a few tenths of a microsecond): where the time over raw SDPA goes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.backends.common import keep_nan_rows
from multihead.backends.sdpa_args import run_sdpa
from multihead.bench.machine import describe
from multihead.backends.dispatch import plan_call


def timed(fn, calls: int) -> float:
    """Microseconds per call of this thread's CPU time (other processes' load moves it less than wall time)."""
    start = time.thread_time()
    for _ in range(calls):
        fn()
    return (time.thread_time() - start) / calls * 1e6


def cases():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, 8, 64, generator=g) for _ in range(3))
    pad = torch.zeros(1, 8, dtype=torch.bool)
    pad[:, -2:] = True
    keep = ~pad[:, None, None, :]
    padding = mh.Mask.key_padding(pad)
    attn = mh.MultiHeadAttention(64, 8, window=16).eval()
    plain = mh.MultiHeadAttention(64, 8).eval()
    x = torch.randn(1, 8, 64, generator=g)
    reused = mh.Mask.window(16)
    plain_attend = lambda: plain(x, mask=reused)  # noqa: E731  (the same work, the Mask made once)

    def decode_step(module, length):
        cache = module.new_cache(1, length + 64)
        module(torch.randn(1, length, 64, generator=g), cache=cache)
        token = torch.randn(1, 1, 64, generator=g)
        filled = cache._filled

        def step():
            cache.lengths.fill_(filled)
            cache._filled = filled
            return module(token, cache=cache)
        return step

    window_step = decode_step(attn, 2048)
    plain_step = decode_step(plain, 64)

    def growing(module, length):
        cache = module.new_cache(1, length + 100_000)  # room for every timed step
        module(torch.randn(1, length, 64, generator=g), cache=cache)
        token = torch.randn(1, 1, 64, generator=g)
        return lambda: module(token, cache=cache)
    return {
        "small causal": {"ours": lambda: mh.attention(q, k, v, causal=True),
                         "raw SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)},
        "small key padding": {"ours": lambda: mh.attention(q, k, v, padding),
                              "raw SDPA": lambda: F.scaled_dot_product_attention(q, k, v, keep)},
        "window module": {"ours": lambda: attn(x), "reused Mask": plain_attend},
        "window decode 2048": {"ours": window_step, "plain step 64": plain_step},
        "growing decode": {"ours": growing(attn, 2048), "fixed length": decode_step(attn, 2048)},
    }


def stages():
    """The small causal call (B=1, H=12, L=8, D=64) built up one layer at a time, each layer timed whole."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 12, 8, 64, generator=g) for _ in range(3))
    problem, chosen, plan = plan_call(q, k, v, None, True, None, None, None, 0.0, "auto")
    scale = problem.scale
    return {"raw SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
            "+ the backend's SDPA call (scale given)": lambda: F.scaled_dot_product_attention(
                q, k, v, None, 0.0, True, scale=scale),
            "+ NaN-row pass": lambda: keep_nan_rows(F.scaled_dot_product_attention(q, k, v, None, 0.0, True,
                                                                                   scale=scale), q),
            "+ run_sdpa's checks": lambda: run_sdpa(q, k, v, plan, 0.0, scale, False),
            "+ the backend's run": lambda: chosen.run(problem, plan),
            "+ plan (a cache hit)": lambda: chosen.run(*plan_call(q, k, v, None, True, None, None, None, 0.0,
                                                                  "auto")[::2]),
            "mh.attention": lambda: mh.attention(q, k, v, causal=True)}


def interleaved(fns: dict, rounds: int, calls: int) -> dict:
    """{name: [microseconds per call, one per round]}: each round times every function once, in turn."""
    for fn in fns.values():
        timed(fn, calls)  # warm up
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(timed(fn, calls))
    return samples


def breakdown(args) -> list[dict]:
    """The small causal call's stages, each row one more layer over raw SDPA."""
    rows, previous = [], None
    for name, s in interleaved(stages(), args.rounds, args.calls).items():
        us = statistics.median(s)
        step = "" if previous is None else f"   step {us - previous:+6.2f} us"
        print(f"{name:42s} {us:7.2f} us{step}")
        rows.append({"stage": name, "us": round(us, 2), "step us": None if previous is None else round(us - previous, 2)})
        previous = us
    return rows


def write_json(path: str, suite: str, rows: list[dict], args) -> None:
    """The rows with the machine and how they were timed, in the form the figure test reads."""
    machine = {**describe(), "clock": "this thread's CPU time", "rounds": args.rounds, "calls": args.calls}
    Path(path).write_text(json.dumps({"machine": machine, suite: rows}) + "\n", encoding="utf-8")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", default="", help="run only the rows whose name contains this")
    parser.add_argument("--breakdown", action="store_true", help="the small causal call's stages instead")
    parser.add_argument("--json", metavar="FILE", help="also write the rows, with the machine, to FILE")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.breakdown:
        with torch.no_grad():
            rows = breakdown(args)
        print(json.dumps(rows))
        if args.json:
            write_json(args.json, "core_seam_breakdown", rows, args)
        return
    results, rows = {}, []
    with torch.no_grad():
        for name, pair in cases().items():
            if args.only not in name:
                continue
            samples = interleaved(pair, args.rounds, args.calls)
            (a, ta), (b, tb) = ((label, statistics.median(s)) for label, s in samples.items())
            ratios = [x / y for x, y in zip(samples[a], samples[b])]
            results[name] = {a: round(ta, 1), b: round(tb, 1), "ratio": round(statistics.median(ratios), 3)}
            rows.append({"case": name, "ours": a, "against": b, "ours us": round(ta, 2), "against us": round(tb, 2),
                         "ratio": round(statistics.median(ratios), 3)})
            print(f"{name:20s} {a} {ta:8.1f} us   {b} {tb:8.1f} us   ratio {statistics.median(ratios):.3f}")
    print(json.dumps(results))
    if args.json:
        write_json(args.json, "core_seam", rows, args)


if __name__ == "__main__":
    main()
