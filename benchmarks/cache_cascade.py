"""Shared prefixes in a paged cache: the memory 16 sequences hold when they share an 8k-token prefix through
fork, against each holding its own copy; and the cascade decode step against the unshared step.

    python benchmarks/cache_cascade.py [--out benchmarks/cache-cascade.json] [--tiny]

B=16 sequences, a prefix of P=8192 tokens, each with its own suffix of 256 tokens; bf16, H=32, Hkv=8, D=128,
pages of 16 tokens, one torch thread. Memory: `memory_bytes()` of the paged cache (pages in use) with the
prefix forked from sequence 0, against the same tokens appended to every sequence. Step: one query token per
sequence; the cascade step (caches/cascade.py: the prefix read once for all 16 sequences, merged with each
suffix by the log-sum-exp) against `mh.attention` over a contiguous KVCache holding the same tokens (the
decode step as it runs without sharing). Median of the timed runs, in interleaved rounds after a warm-up.
Goals (issue 33): shared memory at most 1/10 of the unshared; the cascade step at least 6x faster. `--tiny`
shrinks every size (a check of the script, not a measurement).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import multihead as mh
from multihead.bench import machine
from multihead.caches.base import BOTTOM_RIGHT
from multihead.caches.cascade import cascade_attention

SIZES = {"B": 16, "P": 8192, "suffix": 256, "H": 32, "Hkv": 8, "D": 128, "page_size": 16}
TINY = {"B": 4, "P": 256, "suffix": 32, "H": 4, "Hkv": 2, "D": 16, "page_size": 16}
GOALS = {"memory_ratio": 0.1, "speedup": 6.0}


def _tokens(s: dict, dtype):
    g = torch.Generator().manual_seed(0)
    prefix = [torch.randn(1, s["Hkv"], s["P"], s["D"], generator=g).to(dtype) for _ in range(2)]
    suffix = [torch.randn(s["B"], s["Hkv"], s["suffix"], s["D"], generator=g).to(dtype) for _ in range(2)]
    return prefix, suffix


def _paged(s: dict, dtype, shared: bool, prefix, suffix) -> mh.KVCache:
    B = s["B"]
    cache = mh.KVCache(B, s["P"] + s["suffix"], s["Hkv"], s["D"], page_size=s["page_size"], dtype=dtype)
    full = [t.expand(B, -1, -1, -1).contiguous() for t in prefix]
    if shared:
        cache.append(*full, torch.tensor([s["P"]] + [0] * (B - 1)))
        for b in range(1, B):
            cache.fork(0, b)
    else:
        cache.append(*full)
    cache.append(*suffix)
    return cache


def _medians(fns, runs: int) -> list[float]:
    """Median seconds of each function, timed in interleaved rounds (one run of each per round) after a
    warm-up, so that a change of load on a shared machine falls on all of them alike."""
    times = [[] for _ in fns]
    for fn in fns:
        fn()
    for _ in range(runs):
        for fn, kept in zip(fns, times):
            start = time.perf_counter()
            fn()
            kept.append(time.perf_counter() - start)
    return [statistics.median(kept) for kept in times]


def _prefix_products(s: dict, dtype):
    """The prefix pass's two matrix products alone, on contiguous operands: per kv head, the G * B query rows
    against the P prefix keys, then the weights against the P values (the floor of the cascade step on this
    machine: the same arithmetic as the unshared step, done once as matrix products)."""
    rows_per_head = s["H"] // s["Hkv"] * s["B"]
    g = torch.Generator().manual_seed(2)
    rows, keys, values = (torch.randn(s["Hkv"], n, s["D"], generator=g).to(dtype)
                          for n in (rows_per_head, s["P"], s["P"]))
    weights = torch.rand(s["Hkv"], rows_per_head, s["P"], generator=g).to(dtype)
    return lambda: (torch.bmm(rows, keys.transpose(1, 2)), torch.bmm(weights, values))


def measure(s: dict, runs: int) -> dict:
    torch.set_num_threads(1)
    dtype = torch.bfloat16
    prefix, suffix = _tokens(s, dtype)
    unshared = _paged(s, dtype, False, prefix, suffix)
    unshared_bytes = unshared.memory_bytes()
    del unshared
    shared = _paged(s, dtype, True, prefix, suffix)
    shared_bytes = shared.memory_bytes()
    flat = mh.KVCache(s["B"], s["P"] + s["suffix"], s["Hkv"], s["D"], dtype=dtype)
    keys, values, _ = flat.append(*[torch.cat((t.expand(s["B"], -1, -1, -1), u), 2) for t, u in zip(prefix, suffix)])
    q = torch.randn(s["B"], s["H"], 1, s["D"], generator=torch.Generator().manual_seed(1)).to(dtype)
    with torch.inference_mode():
        plain = mh.attention(q, keys, values, BOTTOM_RIGHT)
        cascade = cascade_attention(q, shared, prefix=s["P"])
        drift = float((cascade.float() - plain.float()).abs().max() / plain.float().abs().max())
        backend = mh.dispatch(q, keys, values, BOTTOM_RIGHT).backend
        products = _prefix_products(s, dtype)
        t_plain, t_cascade, t_products = _medians([lambda: mh.attention(q, keys, values, BOTTOM_RIGHT),
                                                   lambda: cascade_attention(q, shared, prefix=s["P"]),
                                                   products], runs)
    flops = 4 * s["B"] * s["H"] * s["P"] * s["D"]  # the prefix's q @ K^T and p @ V, with or without sharing
    info = machine.describe()
    info["threads"] = 1
    return {"machine": info, "sizes": s, "dtype": "bfloat16", "goals": GOALS,
            "memory": {"shared_bytes": shared_bytes, "unshared_bytes": unshared_bytes,
                       "ratio": shared_bytes / unshared_bytes},
            "step": {"unshared_ms": t_plain * 1e3, "unshared_backend": backend, "cascade_ms": t_cascade * 1e3,
                     "speedup": t_plain / t_cascade, "cascade_drift_vs_unshared": drift, "runs": runs,
                     "prefix_gflop": flops / 1e9, "prefix_products_ms": t_products * 1e3,
                     "speedup_bound_by_products": t_plain / t_products},
            "load_average_at_end": machine.load_average()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--tiny", action="store_true", help="small sizes: checks the script, measures nothing")
    args = parser.parse_args(argv)
    result = measure(TINY if args.tiny else SIZES, 3 if args.tiny else args.runs)
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    return result


if __name__ == "__main__":
    main()
