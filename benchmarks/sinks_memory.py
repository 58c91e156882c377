"""Peak memory of attention with sinks, forward and backward: the fused path against the call without sinks
and against the reference math (where sinks with gradients ran before they rode on the flash kernel).

    python benchmarks/sinks_memory.py [--out benchmarks/sinks-memory.json]
                                      [--markdown benchmarks/sinks-memory-results.md] [--length 4096] [--tiny]

B=1, H=4, D=64, fp32, one torch thread; q, k, v and the sinks need grad. Each case runs in a fresh Python
process (the allocator keeps freed pages, so one process would report its largest case ever after): it
builds the inputs, runs forward + backward once to warm up and once more, and reports its peak RSS
(VmHWM, the whole process, torch included), its RSS once the inputs were built, the backend `mh.dispatch`
names, and the measured pass's wall time. Cases: causal and a sliding window (Mask.window(128) & causal,
gpt-oss), each without sinks, with sinks ("auto"), and with sinks on backend="math". The goal (issue 27):
with sinks the peak is at most 2x the call without them. `--tiny` runs N=256 (a check of the script).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import torch

from multihead.bench import machine
from multihead.bench.memory import status_bytes

MIB = 1024**2
HEADS, HEAD_DIM, WINDOW = 4, 64, 128
CASES = [  # (mask, sinks, backend)
    ("causal", False, "auto"), ("causal", True, "auto"), ("causal", True, "math"),
    ("window", False, "auto"), ("window", True, "auto"), ("window", True, "math"),
]
GOAL = 2.0  # peak with sinks / peak without, at most


def probe(mask_name: str, sinks: bool, backend: str, length: int) -> dict:
    """One case in this process: {"peak_mib", "setup_mib", "backend", "seconds"}."""
    import multihead as mh

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, HEADS, length, HEAD_DIM, generator=g).requires_grad_() for _ in range(3))
    s = torch.randn(HEADS, generator=g).requires_grad_() if sinks else None
    mask = mh.Mask.window(WINDOW) & mh.Mask.causal() if mask_name == "window" else mh.Mask.causal()
    chosen = mh.dispatch(q, k, v, mask, sinks=s, backend=backend).backend
    setup = status_bytes("VmRSS")
    seconds = 0.0
    for _ in range(2):  # warm-up, then the measured pass
        start = time.perf_counter()
        mh.attention(q, k, v, mask, sinks=s, backend=backend).sum().backward()
        seconds = time.perf_counter() - start
    return {"peak_mib": status_bytes("VmHWM") / MIB, "setup_mib": setup / MIB, "backend": chosen,
            "seconds": seconds}


def run_case(mask_name: str, sinks: bool, backend: str, length: int) -> dict:
    """`probe` in a fresh Python process."""
    spec = json.dumps({"mask_name": mask_name, "sinks": sinks, "backend": backend, "length": length})
    done = subprocess.run([sys.executable, __file__, "--probe", spec], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(length: int) -> dict:
    info = machine.describe()
    info["threads"] = 1
    rows = []
    for mask_name, sinks, backend in CASES:
        row = {"mask": mask_name, "sinks": sinks, "asked": backend, **run_case(mask_name, sinks, backend, length)}
        rows.append(row)
    for row in rows:  # against the same mask without sinks
        plain = next(r for r in rows if r["mask"] == row["mask"] and not r["sinks"])
        row["peak_ratio"] = row["peak_mib"] / plain["peak_mib"]
        grown, plain_grown = row["peak_mib"] - row["setup_mib"], plain["peak_mib"] - plain["setup_mib"]
        row["growth_ratio"] = grown / plain_grown if plain_grown > 0 else None
    return {"machine": info, "length": length, "heads": HEADS, "head_dim": HEAD_DIM, "window": WINDOW, "goal": GOAL,
            "load_average_at_end": machine.load_average(), "rows": rows}


def markdown(result: dict) -> str:
    """One row per case: backend, peak RSS, its growth over the inputs, the ratios to the call without sinks."""
    lines = ["| mask | sinks | asked | ran | peak RSS MiB | peak - setup MiB | peak / no sinks | growth / no sinks "
             "| fwd+bwd s |", "|" + "---|" * 9]
    for r in result["rows"]:
        mask = "causal" if r["mask"] == "causal" else f"window {result['window']} & causal"
        growth = "" if r["growth_ratio"] is None else f"{r['growth_ratio']:.2f}x"
        cells = [mask, "yes" if r["sinks"] else "no", r["asked"], r["backend"], f"{r['peak_mib']:.0f}",
                 f"{r['peak_mib'] - r['setup_mib']:.0f}", f"{r['peak_ratio']:.2f}x", growth, f"{r['seconds']:.3f}"]
        lines.append("| " + " | ".join(cells) + " |")
    info = result["machine"]
    start, end = (tuple(x) if x else x for x in (info["load_average"], result["load_average_at_end"]))  # JSON: lists
    return "\n".join([f"CPU: {info['cpu']} ({info['cpu_flags']}), torch {info['torch']}, 1 torch thread, "
                      f"load average {start} at the start, {end} at the end. B=1, H={result['heads']}, "
                      f"N={result['length']}, D={result['head_dim']}, fp32, forward + backward (q, k, v and the "
                      "sinks need grad), a fresh process per case; peak RSS is the whole process (VmHWM), setup its "
                      "RSS once the inputs were built. Goal: with sinks, peak / no sinks at most "
                      f"{result['goal']:g}x.", "", *lines])


def main(argv: list[str] | None = None) -> dict | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--markdown", help="write the Markdown table here")
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--tiny", action="store_true", help="N=256: checks the script, measures nothing")
    parser.add_argument("--probe", help=argparse.SUPPRESS)  # one case, in the fresh process run_case starts
    args = parser.parse_args(argv)
    if args.probe:
        print(json.dumps(probe(**json.loads(args.probe))))
        return None
    result = measure(256 if args.tiny else args.length)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(result) + "\n")
    return result


if __name__ == "__main__":
    main()
