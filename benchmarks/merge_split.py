"""merge_states of a call split into key ranges against the whole call, on every backend that returns the
log-sum-exp (issue 33's merge goal), with the figures the README quotes.

    PYTHONPATH=src python benchmarks/merge_split.py [--json benchmarks/merge-split.json]

One call per backend at 2100 keys (B=3, H=4, Hkv=2, D=32; lengths 2100, 1333 and 0, so one sequence keeps no
key; sinks), fp32: the whole call with return_lse=True, then the same call split into 2 and into 7 ranges of
keys, each range attended alone (the sinks with the first) and merged with mh.merge_states. Reported: the
largest |merged - whole| of out relative to the whole out's largest value, and of lse (absolute, over rows
that keep a key), and whether the empty rows come out exactly 0 with lse -inf (or their sink). The same
check, with float64 references, bf16 and fp16, is the test tests/test_core_lse.py.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import multihead as mh
from multihead.bench.machine import describe
from multihead.caches.quantized import Quantized, quantize

N = 2100
LENS = torch.tensor([N, 1333, 0])
CASES = {"math": 16, "sdpa": 16, "decode": 2, "quantized": 2}


def part(q, k, v, a: int, b: int, sinks, backend: str):
    keys = k.slots(a, b) if isinstance(k, Quantized) else k[:, :, a:b]
    values = v.slots(a, b) if isinstance(v, Quantized) else v[:, :, a:b]
    return mh.attention(q, keys, values, mh.Mask.lengths((LENS - a).clamp(0, b - a)), sinks=sinks,
                        backend=backend, return_lse=True)


def measure(backend: str, Lq: int) -> dict:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(3, 4, Lq, 32, generator=g)
    k, v = (torch.randn(3, 2, N, 32, generator=g) for _ in range(2))
    if backend == "quantized":
        k, v = (Quantized(*quantize(t, torch.int8), torch.int8) for t in (k, v))
    sinks = torch.linspace(-1.0, 2.0, 4)
    whole, whole_lse = part(q, k, v, 0, N, sinks, backend)
    kept = torch.isfinite(whole_lse) & (LENS > 0).view(3, 1, 1)
    row = {"backend": backend, "query rows": Lq}
    for n in (2, 7):
        edges = torch.linspace(0, N, n + 1).long().tolist()
        states = [part(q, k, v, a, b, sinks if i == 0 else None, backend)
                  for i, (a, b) in enumerate(zip(edges[:-1], edges[1:]))]
        out, lse = mh.merge_states(states)
        row[f"{n} ranges: out rel. diff"] = float((out - whole).abs().max() / whole.abs().max())
        row[f"{n} ranges: lse abs. diff"] = float((lse - whole_lse)[kept].abs().max())
        row[f"{n} ranges: empty rows exact"] = bool(not out[2].any() and torch.equal(lse[2], whole_lse[2]))
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    with torch.no_grad():
        rows = [measure(name, Lq) for name, Lq in CASES.items()]
    for r in rows:
        print(r)
    if args.json:
        args.json.write_text(json.dumps({"machine": describe(), "keys": N, "dtype": "float32", "rows": rows},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
