"""The decode kernel's goals, per build (ISA) on this machine: read share of the cold step, contiguous and paged;
the paged step against the contiguous one; the int8 cache's step against the bf16 cache's.

    python benchmarks/decode_goals.py [--out benchmarks/decode-goals.json] [--markdown benchmarks/decode-goals-results.md]
                                      [--rounds 8] [--repeats 5] [--builds native x86-64-v3] [--tiny]

1. Read share and paging (B=1 H=32 Hkv=8 D=128, N=16384 keys, fp32 and bf16, one new query): the kernel of
   each build called directly (cpu.calls.Kernel: no dispatch) on a contiguous cache (B, Hkv, N, D), on pages
   of 16 and on pages of 64 (the same numbers on a pool in shuffled page order, read in place through the
   block table), and the read bandwidth (`sum()` of 256 MiB fp32), interleaved round by round. Every call
   finds its keys out of the CPU's caches: the calls between two of the same form read more than the last
   level cache holds. Share = bytes of K and V / time over the bandwidth of the same round; paged / contiguous
   = the median of the per-round speed ratios.
2. Quantized (H = Hkv = 8, D = 128, N = 16384, a bf16 query): the kernel's step over an int8 cache's codes and
   scales against its step over a bf16 cache, interleaved with the bandwidth read (attention alone, per build);
   and, for the native build (the one the module runs), the module step of a bf16 model E = 1024 with
   new_cache(kv_dtype=None | torch.int8) (projections, RoPE, the cache write, attention), with the int8 output's
   drift against the fp32 model over an fp32 cache, relative to its largest value.

One torch thread, the process's CPU clock (time spent waiting for a core is not counted); the rounds are
repeated and medians taken over the repeats. The JSON records the machine (CPU, flags, load average at the
start and at the end) and each row's build and ISA.
"""
from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys

import torch

import multihead as mh
from multihead.backends.cpu import build as decode_build
from multihead.bench import machine
from multihead.bench.suites.quant_cache import filled
from multihead.bench.timing import compare, ratio, set_clock
from multihead.caches.quantized import quantize

BANDWIDTH = "read bandwidth"
GOALS = {"share avx512": 0.70, "share avx2": 0.60, "paged / contiguous": 0.95, "int8 / bf16": 1.5, "drift": 0.02}


def paged(k: torch.Tensor, v: torch.Tensor, page_size: int, g: torch.Generator):
    """k (1, Hkv, N, D), v alike -> (key_pages, value_pages (P, Hkv, S, .), table (1, P) int32): the pages in
    shuffled order in the pool."""
    _, Hkv, N, D = k.shape
    P = -(-N // page_size)
    order = torch.randperm(P, generator=g)
    pad = P * page_size - N

    def pages(x):
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))[0]  # (Hkv, P * S, .)
        x = x.view(Hkv, P, page_size, x.shape[-1]).transpose(0, 1)  # (P, Hkv, S, .)
        pool = torch.empty_like(x)
        pool[order] = x
        return pool.contiguous()

    return pages(k), pages(v), order.to(torch.int32).view(1, P).contiguous()


def rounds_of(fns: dict, after: dict, rounds: int, repeats: int) -> list[dict]:
    """`repeats` runs of `rounds` interleaved rounds: a list of {name: Timing}."""
    return [compare(fns, rounds=rounds, warmup=1, after=after) for _ in range(repeats)]


def share_rows(kernel, build: str, dtype: torch.dtype, N: int, sizes: dict, rounds: int, repeats: int) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    H, Hkv, D = sizes["heads"], sizes["kv_heads"], sizes["head_dim"]
    k = torch.randn(1, Hkv, N, D, generator=g).to(dtype)
    v = torch.randn(1, Hkv, N, D, generator=g).to(dtype)
    q = torch.randn(1, H, 1, D, generator=g).to(dtype)
    lo, hi = torch.zeros(1, 1, dtype=torch.int64), torch.full((1, 1), N, dtype=torch.int64)
    qpos, empty = (hi - 1).float(), torch.empty(0)
    big = torch.randn(sizes["rotation_mib"] * 2**20 // 4, generator=g)
    nbytes = 2 * N * Hkv * D * k.element_size()
    fns = {"contiguous": lambda: kernel.decode_step(q, k, v, lo, hi, qpos, empty, empty, D ** -0.5, 0.0)}
    for S in (16, 64):
        kp, vp, table = paged(k, v, S, g)
        fns[f"paged {S}"] = (lambda kp=kp, vp=vp, table=table:
                             kernel.decode_paged(q, kp, vp, table, lo, hi, qpos, empty, empty, D ** -0.5, 0.0))
        out = fns[f"paged {S}"]()
        assert (out.float() - fns["contiguous"]().float()).abs().max().item() < 1e-2, "paged != contiguous"
    fns[BANDWIDTH] = big.sum
    runs = rounds_of(fns, {BANDWIDTH: fns["contiguous"]}, rounds, repeats)
    rows = []
    for name in fns:
        shares = [(big.numel() * 4 if name == BANDWIDTH else nbytes) / (big.numel() * 4) * ratio(t[BANDWIDTH], t[name])
                  for t in runs]
        row = {"part": "read share", "build": build, "isa": kernel.isa(), "dtype": str(dtype).removeprefix("torch."),
               "N": N, "form": name, "ms": round(statistics.median(t[name].median_s for t in runs) * 1e3, 4),
               "share": round(statistics.median(shares), 4), "shares": [round(x, 4) for x in shares]}
        if name.startswith("paged"):
            speeds = [ratio(t["contiguous"], t[name]) for t in runs]  # > 1: paged faster
            row["x contiguous"] = round(statistics.median(speeds), 4)
            row["x contiguous per repeat"] = [round(x, 4) for x in speeds]
        rows.append(row)
    return rows


def quant_rows(kernel, build: str, N: int, sizes: dict, rounds: int, repeats: int) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    H, D = sizes["quant_heads"], sizes["head_dim"]
    k = torch.randn(1, H, N, D, generator=g)
    v = torch.randn(1, H, N, D, generator=g)
    q = torch.randn(1, H, 1, D, generator=g).bfloat16()
    kb, vb = k.bfloat16(), v.bfloat16()
    (kc, ks), (vc, vs) = quantize(k, torch.int8), quantize(v, torch.int8)
    lo, hi = torch.zeros(1, 1, dtype=torch.int64), torch.full((1, 1), N, dtype=torch.int64)
    qpos, empty = (hi - 1).float(), torch.empty(0)
    big = torch.randn(sizes["rotation_mib"] * 2**20 // 4, generator=g)
    fns = {"bf16 cache": lambda: kernel.decode_step(q, kb, vb, lo, hi, qpos, empty, empty, D ** -0.5, 0.0),
           "int8 cache": lambda: kernel.decode_quantized(q, kc, vc, ks, vs, lo, hi, qpos, empty, empty, D ** -0.5, 0.0),
           BANDWIDTH: big.sum}
    runs = rounds_of(fns, {BANDWIDTH: fns["bf16 cache"]}, rounds, repeats)
    speeds = [ratio(t["bf16 cache"], t["int8 cache"]) for t in runs]
    nbytes = {"bf16 cache": 2 * N * H * D * 2, "int8 cache": 2 * N * H * (D + 4), BANDWIDTH: big.numel() * 4}
    return [{"part": "int8 attention alone", "build": build, "isa": kernel.isa(), "N": N, "form": name,
             "ms": round(statistics.median(t[name].median_s for t in runs) * 1e3, 4),
             "share": round(statistics.median(nbytes[name] / nbytes[BANDWIDTH] * ratio(t[BANDWIDTH], t[name])
                                              for t in runs), 4),
             **({"x bf16 cache": round(statistics.median(speeds), 4), "x bf16 cache per repeat":
                 [round(x, 4) for x in speeds]} if name == "int8 cache" else {})} for name in fns]


def module_rows(N: int, sizes: dict, rounds: int, repeats: int) -> list[dict]:
    """The module step over a bf16 and an int8 cache (the native build), and the int8 output's drift."""
    H, D = sizes["quant_heads"], sizes["head_dim"]
    E = H * D
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    with torch.no_grad():
        m32 = mh.MultiHeadAttention(E, H, num_kv_heads=H, head_dim=D, bias=False, rope=mh.RoPE(D)).eval()
        m = copy.deepcopy(m32).bfloat16()
        context = torch.randn(1, N, E, generator=g)
        x = torch.randn(1, 1, E, generator=g).bfloat16()
        headroom = 4 + (rounds + 1) * repeats
        reference = m32(x.float(), cache=filled(m32, context, None, torch.float32, 1))
        caches = {"bf16 cache": filled(m, context, None, torch.bfloat16, headroom),
                  "int8 cache": filled(m, context, torch.int8, torch.bfloat16, headroom)}
        drift = {name: ((m(x, cache=c).float() - reference).abs().max() / reference.abs().max()).item()
                 for name, c in caches.items()}
        fns = {name: (lambda c=c: m(x, cache=c)) for name, c in caches.items()}
        runs = rounds_of(fns, {}, rounds, repeats)
    speeds = [ratio(t["bf16 cache"], t["int8 cache"]) for t in runs]
    return [{"part": "int8 module step", "build": "native", "isa": decode_build.isa(), "N": N, "E": E, "form": name,
             "ms": round(statistics.median(t[name].median_s for t in runs) * 1e3, 4),
             "drift vs fp32 cache": round(drift[name], 5),
             **({"x bf16 cache": round(statistics.median(speeds), 4), "x bf16 cache per repeat":
                 [round(x, 4) for x in speeds]} if name == "int8 cache" else {})} for name in fns]


def targets(rows: list[dict]) -> list[dict]:
    """Each goal against its row: {target, build, isa, value, goal, verdict}."""
    out = []

    def add(name, row, key, goal):
        out.append({"target": name, "build": row["build"], "isa": row["isa"], "value": row[key], "goal": goal,
                    "verdict": "met" if row[key] >= goal else "MISSED"})

    for row in rows:
        if row["part"] == "read share" and row["form"] != BANDWIDTH:
            goal = GOALS["share avx512" if row["isa"].startswith("avx512") else "share avx2"]
            add(f"read share, {row['form']} step, {row['dtype']} N={row['N']}", row, "share", goal)
            if row["form"].startswith("paged"):
                add(f"{row['form']} step speed / contiguous step, {row['dtype']} N={row['N']}", row, "x contiguous",
                    GOALS["paged / contiguous"])
        if row["form"] == "int8 cache":
            add(f"{row['part']}: bf16 cache time / int8 cache time, N={row['N']}", row, "x bf16 cache",
                GOALS["int8 / bf16"])
            if "drift vs fp32 cache" in row:
                out.append({"target": "int8 module step output drift vs fp32 cache (of its largest value)",
                            "build": row["build"], "isa": row["isa"], "value": row["drift vs fp32 cache"],
                            "goal": GOALS["drift"],
                            "verdict": "met" if row["drift vs fp32 cache"] <= GOALS["drift"] else "MISSED"})
    return out


def markdown(result: dict) -> str:
    info = result["machine"]
    lines = [f"CPU: {info['cpu']} ({info['cpu_flags']}), {info['threads']} torch thread, clock {info['clock']}, "
             f"load average {tuple(info['load_average'] or ())} at the start, {tuple(result['load_average_at_end'] or ())} "
             f"at the end; {result['repeats']} repeats of {result['rounds']} interleaved rounds (medians over the "
             "repeats).", "", "| target | build (ISA) | value | goal | verdict |", "|---|---|---|---|---|"]
    for t in result["targets"]:
        op = "<=" if "drift" in t["target"] else ">="
        lines.append(f"| {t['target']} | {t['build']} ({t['isa']}) | {t['value']:.3f} | {op} {t['goal']} | {t['verdict']} |")
    lines += ["", "| part | build (ISA) | dtype | form | ms | share of bandwidth | x |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        x = r.get("x contiguous", r.get("x bf16 cache", ""))
        lines.append(f"| {r['part']} N={r['N']} | {r['build']} ({r['isa']}) | {r.get('dtype', '')} | {r['form']} | "
                     f"{r['ms']:.3f} | {r.get('share', '') if 'share' in r else ''} | {x} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out")
    parser.add_argument("--markdown")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--builds", nargs="+", default=["native", "x86-64-v3"])
    parser.add_argument("--parts", nargs="+", default=["share", "quant", "module"])
    parser.add_argument("--tiny", action="store_true", help="small sizes: checks the script, measures nothing")
    args = parser.parse_args(argv)
    sizes = {"heads": 32, "kv_heads": 8, "head_dim": 128, "quant_heads": 8, "rotation_mib": 256, "N": 16384}
    if args.tiny:
        sizes = {"heads": 4, "kv_heads": 2, "head_dim": 32, "quant_heads": 2, "rotation_mib": 1, "N": 100}
    torch.set_num_threads(1)
    set_clock("cpu")
    decode_build.kernel()
    info = machine.describe()
    rows = []
    for build in args.builds:
        kernel, why = decode_build.variant(build) if decode_build.runs_here(build) else (None, "not this CPU")
        if kernel is None:
            print(f"{build} build: skipped ({why})", file=sys.stderr)
            continue
        if "share" in args.parts:
            for dtype in (torch.float32, torch.bfloat16):
                rows += share_rows(kernel, build, dtype, sizes["N"], sizes, args.rounds, args.repeats)
        if "quant" in args.parts:
            rows += quant_rows(kernel, build, sizes["N"], sizes, args.rounds, args.repeats)
    if "module" in args.parts:
        rows += module_rows(sizes["N"], sizes, args.rounds, args.repeats)
    result = {"machine": info, "load_average_at_end": machine.load_average(), "rounds": args.rounds,
              "repeats": args.repeats, "command": "python benchmarks/decode_goals.py " + " ".join(argv or sys.argv[1:]),
              "builds": {b: decode_build.BUILDS[b] for b in args.builds}, "goals": GOALS, "rows": rows,
              "targets": targets(rows)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    text = markdown(result)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(text + "\n")
    print(text)
    return result


if __name__ == "__main__":
    main()
