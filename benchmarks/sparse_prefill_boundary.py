"""Where sparse prefill stops paying: the sparse backend against the dense keep mask of the same keys.

    python benchmarks/sparse_prefill_boundary.py [--out benchmarks/sparse-prefill-boundary.json] [--tiny]

L queries (B=1, H=16, Hkv=4, D=64) each list K keys at or before them (itself included); the same keys as a
dense keep mask (Mask.keep) run through "auto" (SDPA with the mask). For each K, interleaved rounds on one
thread with the process's CPU clock, medians; the ratio dense / sparse says whether the sparse backend is
the faster exact path there (> 1) or not. The largest K at which sparse won at every L measured, per torch
CPU capability and dtype, is the boundary the sparse backend's plan reads (backends/sparse.py). (The dense
mask's cost grows with L and the gathers' with K, but the measured crossing moved little with L: a count
of listed keys fits the measurements better than a fraction of L.)
"""
from __future__ import annotations

import argparse
import json

import torch

import multihead as mh
from multihead.bench import machine
from multihead.bench.timing import compare, ratio, set_clock


def case(L: int, K: int, dtype: torch.dtype, rounds: int) -> dict:
    g = torch.Generator().manual_seed(K)
    H, Hkv, D = 16, 4, 64
    q = torch.randn(1, H, L, D, generator=g).to(dtype)
    k, v = (torch.randn(1, Hkv, L, D, generator=g).to(dtype) for _ in range(2))
    i = torch.arange(L)[:, None]
    listed = (torch.rand(L, K, generator=g) * (i + 1)).long()
    listed[:, 0] = i[:, 0]
    keep = torch.zeros(L, L, dtype=torch.bool).scatter_(1, listed, True).view(1, 1, L, L)
    sparse = mh.Mask.sparse(listed.view(1, L, K)) & mh.Mask.causal()
    fns = {"sparse": lambda: mh.attention(q, k, v, sparse, backend="sparse"),
           "dense keep mask": lambda: mh.attention(q, k, v, mh.Mask.keep(keep))}
    with torch.inference_mode():
        t = compare(fns, rounds=rounds, warmup=1)
    return {"L": L, "K": K, "fraction": K / L, "dtype": str(dtype).removeprefix("torch."),
            "ms": {n: x.median_s * 1e3 for n, x in t.items()}, "dense / sparse": ratio(t["dense keep mask"], t["sparse"])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="benchmarks/sparse-prefill-boundary.json")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    set_clock("cpu")
    lengths, listed, rounds = ((256,), (2, 8, 32), 3) if args.tiny else ((1024, 2048), (8, 16, 32, 64, 128), 3)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for L in lengths:
            for K in listed:
                r = case(L, K, dtype, rounds)
                rows.append(r)
                print(f"{r['dtype']} L={L} K={K}: sparse {r['ms']['sparse']:.1f} ms, dense keep "
                      f"{r['ms']['dense keep mask']:.1f} ms, dense / sparse {r['dense / sparse']:.2f}")
    with open(args.out, "w") as f:
        json.dump({"machine": machine.describe(), "rows": rows, "sparse wins up to K": boundary(rows)}, f)
        f.write("\n")
    print(json.dumps(boundary(rows)))


def boundary(rows: list[dict]) -> dict[str, int]:
    """dtype -> the largest K at which the sparse path beat the dense keep mask at every L measured (0: none)."""
    out = {}
    for dtype in sorted({r["dtype"] for r in rows}):
        mine = [r for r in rows if r["dtype"] == dtype]
        out[dtype] = max([K for K in sorted({r["K"] for r in mine})
                          if all(r["dense / sparse"] > 1.0 for r in mine if r["K"] <= K)], default=0)
    return out


if __name__ == "__main__":
    main()
