"""The CUDA benchmark: attention TFLOP/s, ours against each of SDPA's backends, and the shootout.

    python benchmarks/gpu.py [--out benchmarks/gpu-results.json] [--dry-run]

Sweep (flash-attn's setting): bf16, B * N = 16k tokens, H * D = 2048, D in {64, 128},
N in {512, ..., 16k}, causal and not. For each cell: forward and forward+backward TFLOP/s of
`mh.attention` (auto) and of F.scaled_dot_product_attention forced to each SDPA backend (flash,
efficient, cudnn, math; a backend that cannot run the cell is reported as such). FLOPs follow
flash-attn: 4 * B * H * N^2 * D forward, halved when causal, and 2.5x that for the backward.
Then the shootout (B=8, N=1024, E=768, H=12, causal) and the padded suite on the GPU in bf16.
It runs wherever CUDA is available and is never run by the tests. `--dry-run` runs a few tiny cells
on the CPU to check the script itself.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench import machine
from multihead.bench.peers import Shape
from multihead.bench.registry import build, names
from multihead.bench.suites.padded import dense_baselines


def timer(device: str, fn, warmup: int = 3, repeats: int = 10) -> float:
    """Median seconds per call (CUDA events on the GPU, perf_counter elsewhere)."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def sdpa_backends() -> dict:
    """{name: SDPBackend} for every SDPA backend this torch has."""
    from torch.nn.attention import SDPBackend

    wanted = {"flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "cudnn": "CUDNN_ATTENTION",
              "math": "MATH"}
    return {name: getattr(SDPBackend, attr) for name, attr in wanted.items() if hasattr(SDPBackend, attr)}


def attention_fns(q, k, v, causal: bool) -> dict:
    """{implementation: forward callable} for one (q, k, v)."""
    from torch.nn.attention import sdpa_kernel

    fns = {"ours": lambda: mh.attention(q, k, v, causal=causal)}
    for name, backend in sdpa_backends().items():
        def forced(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        fns[f"sdpa[{name}]"] = forced
    return fns


def sweep_cell(device, dtype, tokens, hidden, d, n, causal) -> list[dict]:
    """One (D, N, causal) cell: TFLOP/s forward and forward+backward per implementation."""
    b, h = max(1, tokens // n), hidden // d
    g = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype, generator=g).requires_grad_()
               for _ in range(3))  # (B, H, N, D)
    flops = 4.0 * b * h * n * n * d / (2 if causal else 1)
    grad = torch.randn(b, h, n, d, device=device, dtype=dtype, generator=g)
    rows = []
    for name, fn in attention_fns(q, k, v, causal).items():
        row = {"D": d, "N": n, "B": b, "H": h, "causal": causal, "implementation": name}
        try:
            with torch.no_grad():
                fwd = timer(device, fn)
            both = timer(device, lambda fn=fn: torch.autograd.grad(fn(), (q, k, v), grad))
            row.update(fwd_tflops=flops / fwd / 1e12, fwd_bwd_tflops=3.5 * flops / both / 1e12)
        except RuntimeError as err:  # a backend that cannot run this cell (or out of memory)
            row["error"] = str(err).splitlines()[0][:160]
        rows.append(row)
    return rows


def shootout(device, dtype, shape: Shape) -> list[dict]:
    """The CPU shootout's implementations on this device: ms forward and forward+backward."""
    rows = []
    for name in names():
        try:
            runner = build(name, shape)
            fwd = timer(device, runner.forward)
            both = timer(device, runner.forward_backward)
            rows.append({"implementation": name, "forward ms": fwd * 1e3, "fwd+bwd ms": both * 1e3})
        except RuntimeError as err:
            rows.append({"implementation": name, "error": str(err).splitlines()[0][:160]})
    return rows


def padded(device, dtype, n: int, heads: int = 8, d: int = 64, batch: int = 8) -> list[dict]:
    """Length-aware path vs the strongest dense SDPA baseline: lengths evenly spaced from N/8 to N."""
    q, k, v = (torch.randn(batch, heads, n, d, device=device, dtype=dtype) for _ in range(3))
    lens = torch.tensor([n * (i + 1) // batch for i in range(batch)], device=device)
    rows = []
    for label, mask in (("keys", mh.Mask.lengths(lens)), ("both", mh.Mask.lengths(lens, query_lens=lens))):
        with torch.no_grad():
            dense = {name: timer(device, call)
                     for name, call in dense_baselines(q, k, v, lens, pad_queries=label == "both").items()}
            ours = timer(device, lambda: mh.attention(q, k, v, mask))
        strongest = min(dense, key=dense.get)
        rows.append({"padding": label, "strongest dense": strongest, "dense ms": dense[strongest] * 1e3,
                     "ours ms": ours * 1e3, "dense / ours": dense[strongest] / ours,
                     "backend": mh.dispatch(q, k, v, mask).backend})
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="benchmarks/gpu-results.json")
    parser.add_argument("--dry-run", action="store_true", help="tiny cells on the CPU, to test the script")
    args = parser.parse_args()
    if args.dry_run:
        device, dtype, tokens, hidden = "cpu", torch.float32, 256, 128
        lengths, dims, shoot, pad_n = (64, 128), (64,), Shape(2, 32, 64, 4), 128
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: this script measures GPUs only (try --dry-run)")
            return 1
        device, dtype, tokens, hidden = "cuda", torch.bfloat16, 16 * 1024, 2048
        lengths, dims = (512, 1024, 2048, 4096, 8192, 16384), (64, 128)
        shoot, pad_n = Shape(8, 1024, 768, 12, dtype=dtype, device=device), 4096
    info = machine.describe()
    if device == "cuda":
        info["device"] = torch.cuda.get_device_name()
    sweep = [row for d in dims for n in lengths for causal in (False, True)
             for row in sweep_cell(device, dtype, tokens, hidden, d, n, causal)]
    for row in sweep:
        rates = (f"fwd {row['fwd_tflops']:7.2f}  fwd+bwd {row['fwd_bwd_tflops']:7.2f} TFLOP/s"
                 if "error" not in row else f"cannot run: {row['error']}")
        print(f"D={row['D']:<4} N={row['N']:<6} causal={row['causal']!s:<5} {row['implementation']:<16} {rates}")
    result = {"machine": info, "sweep": sweep, "shootout": shootout(device, dtype, shoot),
              "padded": padded(device, dtype, pad_n)}
    for row in result["shootout"] + result["padded"]:
        print(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
