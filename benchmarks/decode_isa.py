"""The decode kernel of every build this CPU runs against the plain-torch form: the evidence behind
decode_choice.FASTER (which form the decode backend runs, per ISA build and dtype).

    python benchmarks/decode_isa.py [--out benchmarks/decode-isa.json] [--markdown benchmarks/decode-isa-results.md]
                                    [--rounds 10] [--repeats 5] [--contexts 4096 16384] [--tiny]

One decode step, B=1 H=32 Hkv=8 D=128 (the decode suite's attention-alone case), fp32 and bf16: the
kernel of each build in decode_build.BUILDS that runs here (native, x86-64-v3: AVX2 + FMA, portable:
the plain C++ path), called directly; the plain-torch form (`plain_decode_step`); SDPA on the queries
grouped per kv head (a peer, not a form of the backend); and the read bandwidth (`sum()` of 256 MiB
fp32), interleaved round by round on one torch thread with the process's CPU clock, the rounds
repeated (the medians over the repeats are reported, with each repeat's share). Each call takes
the next cache of a rotation spanning at least 256 MiB, so no call finds its keys in the CPU's caches
(cold). Share = bytes of K and V / time, over the bandwidth of the same rounds. The JSON records the
machine (CPU, its vector ISA, load) with every figure. `--tiny` runs small sizes (a check of the script).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F

from multihead.backends.cpu import build as decode_build
from multihead.backends.decode.ranges import key_ranges
from multihead.backends.decode.step import plain_decode_step
from multihead.bench import machine
from multihead.bench.suites.decode import DTYPES, Rotation, Sizes, copies_for, filled_cache, kv_bytes
from multihead.bench.timing import compare, ratio, set_clock

PLAIN, GROUPED, BANDWIDTH = "plain-torch form", "SDPA on grouped queries", "read bandwidth"


def builds_here() -> dict[str, object]:
    """{build name: its Kernel} for every build in BUILDS that builds and runs on this CPU."""
    found = {}
    for name in decode_build.BUILDS:
        kernel, why = decode_build.variant(name) if decode_build.runs_here(name) else (None, "not this CPU")
        if kernel is None:
            print(f"{name} build: skipped ({why})", file=sys.stderr)
        else:
            found[name] = kernel
    return found


def measure(sizes: Sizes, dtype: str, length: int, kernels: dict, rounds: int, repeats: int) -> list[dict]:
    """Rows {dtype, N, form, build, isa, ms, share, shares} of one case: every form timed in the same
    rounds, `repeats` times; share and ms are the medians over the repeats, shares each repeat's."""
    g = torch.Generator().manual_seed(0)
    H, Hkv, D, dt = sizes.heads, sizes.kv_heads, sizes.head_dim, DTYPES[dtype]
    lengths = torch.tensor([length])
    first = filled_cache(lengths, length, sizes, dt, g)
    nbytes = kv_bytes(first[0], lengths + 1)
    turn = Rotation([first] + [filled_cache(lengths, length, sizes, dt, g)
                               for _ in range(copies_for(nbytes, sizes) - 1)])
    q = torch.randn(1, H, 1, D, generator=g).to(dt)  # (B, H, 1, D)
    grouped = q.view(1, Hkv, H // Hkv, D)  # (B, Hkv, G, D)
    lo, hi, qpos, _ = key_ranges(None, 1, H, 1, length + 1, "cpu")
    big = torch.randn(sizes.rotation_mib * 2**20 // 4, generator=g)
    empty = torch.empty(0)
    fns = {f"kernel, {name} build": (lambda k=k: k.decode_step(q, *turn()[:2], lo, hi, qpos, empty, empty,
                                                               D**-0.5, 0.0)) for name, k in kernels.items()}
    fns[PLAIN] = lambda: plain_decode_step(q, *turn()[:2], lo, hi, qpos, D**-0.5)
    fns[GROUPED] = lambda: F.scaled_dot_product_attention(grouped, *turn()[:2])
    fns[BANDWIDTH] = big.sum
    after = {BANDWIDTH: fns[PLAIN]}  # the call right after the large sum() runs slower: an untimed one
    shares: dict[str, list[float]] = {name: [] for name in fns}
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):  # the machine's load drifts: each repeat pairs its own rounds, then medians
        t = compare(fns, rounds=rounds, warmup=1, after=after)
        for name, timing in t.items():
            shares[name].append(1.0 if name == BANDWIDTH else nbytes / (big.numel() * 4) * ratio(t[BANDWIDTH], timing))
            times[name].append(timing.median_s)
    rows = []
    for name in fns:
        build = name.split(", ")[1].removesuffix(" build") if name.startswith("kernel") else ""
        seconds = statistics.median(times[name])
        rows.append({"dtype": dtype, "N": length, "form": "kernel" if build else name, "build": build,
                     "isa": kernels[build].isa() if build else "", "ms": round(seconds * 1e3, 4),
                     "share": round(statistics.median(shares[name]), 4),
                     "shares": [round(x, 4) for x in shares[name]],
                     "GB/s": round((big.numel() * 4 if name == BANDWIDTH else nbytes) / seconds / 1e9, 2)})
    return rows


def markdown(result: dict) -> str:
    """The read-share table: one row per form and build, one column per dtype and N."""
    cases = sorted({(r["dtype"], r["N"]) for r in result["rows"]}, key=lambda c: (c[0] != "fp32", c[1]))
    head = "| form | build (ISA) | " + " | ".join(f"{d} N={n}" for d, n in cases) + " |"
    lines = [head, "|" + "---|" * (2 + len(cases))]
    forms = [(r["form"], r["build"], r["isa"]) for r in result["rows"] if (r["dtype"], r["N"]) == cases[0]]
    for form, build, isa in forms:
        cells = []
        for d, n in cases:
            row = next(r for r in result["rows"] if (r["dtype"], r["N"], r["form"], r["build"]) == (d, n, form, build))
            cells.append(f"{row['share']:.0%} ({min(row['shares']):.0%} to {max(row['shares']):.0%}; {row['ms']:.2f} ms)")
        lines.append(f"| {form} | {f'{build} ({isa})' if build else ''} | " + " | ".join(cells) + " |")
    info = result["machine"]
    start, end = (tuple(x) if x else x for x in (info["load_average"], result["load_average_at_end"]))  # JSON: lists
    return "\n".join([f"CPU: {info['cpu']} ({info['cpu_flags']}), {info['threads']} torch thread(s), "
                      f"clock {info['clock']}, load average {start} at the start, "
                      f"{end} at the end; {result['repeats']} repeats of {result['rounds']} "
                      "interleaved rounds: the median share over the repeats (ms: the median time), and in brackets "
                      "the lowest and highest repeat.",
                      "", *lines])


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="write the JSON here")
    parser.add_argument("--markdown", help="write the Markdown table here")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per case (medians over them)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--tiny", action="store_true", help="small sizes: checks the script, measures nothing")
    args = parser.parse_args(argv)
    sizes = Sizes(contexts=tuple(args.contexts))
    if args.tiny:
        sizes = Sizes(contexts=(40,), heads=4, kv_heads=2, head_dim=32, rotation_mib=1)
    torch.set_num_threads(1)
    set_clock("cpu")
    kernels = builds_here()
    info = machine.describe()  # with the CPU's vector flags and the native build's path (decode_isa)
    rows = [row for dtype in sizes.dtypes for n in sizes.contexts
            for row in measure(sizes, dtype, n, kernels, args.rounds, args.repeats)]
    result = {"machine": info, "load_average_at_end": machine.load_average(), "rounds": args.rounds,
              "repeats": args.repeats,
              "case": f"B=1 H={sizes.heads} Hkv={sizes.kv_heads} D={sizes.head_dim}, cold",
              "builds": {name: {"isa": k.isa(), "flags": decode_build.BUILDS[name]} for name, k in kernels.items()},
              "rows": rows}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    text = markdown(result)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    print(text)
    shares = [r["share"] for r in rows if r["form"] == "kernel"]
    print(f"kernel shares: median {statistics.median(shares):.0%}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
