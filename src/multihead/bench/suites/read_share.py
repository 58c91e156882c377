"""Decode suite, part 1a: the attention of one decode step against the read bandwidth, one denominator per run.

B=1, H=32, Hkv=8, D=128, one new token against a KVCache of N tokens: `mh.attention` on the cache's keys,
values and mask (what the module calls), the decode kernel called directly, the plain-torch form, raw
SDPA with enable_gqa and SDPA on the queries grouped per kv head, and the `sum()` of a `rotation_mib`
fp32 tensor, in the same interleaved rounds. Each call takes the next cache of a rotation spanning at
least as many bytes, so no call finds its keys in the CPU's caches (`Rotation`, `filled_cache`: the
ragged part reads such caches too).

The share of the read bandwidth divides each row's rate (bytes of K and V / its median time) by ONE
bandwidth for the whole run: the median of every part's `sum()` rounds at that thread count. A part
whose own rounds read slower (another job, the page cache, a throttled core) then shows as a low
bandwidth row instead of lifting that part's shares; each part's own rate stays in its bandwidth row
and in the suite's notes. The rows and the target of a part are written once every part has run
(`measure` then `report`), at the place in the table where the part ran.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.backends.decode.ranges import key_ranges
from multihead.backends.decode.step import decode_step, kernel_build, plain_decode_step
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import Timing, clock_name, compare, ratio, set_clock
from multihead.caches.kv import KVCache

PLAIN = "decode step, plain-torch form (what runs without a compiler)"
KERNEL = "the decode kernel alone (decode_step: no dispatch, no plan)"
OURS, RAW, GROUPED = "ours: mh.attention", "raw SDPA, enable_gqa", "SDPA on grouped queries"
OFF = 0.1  # a part whose own bandwidth is this far from the run's is named in the notes
SHARE_GOAL = 0.5


@dataclass
class Part:
    """One case's measurements, kept until the run's bandwidth is known. nbytes: K and V a step reads;
    big_bytes: what one bandwidth `sum()` reads; timings: every row's rounds at the suite's threads, the
    bandwidth's under `bandwidth`; more: {threads: {OURS, bandwidth}} at other thread counts."""

    case: str
    nbytes: int
    big_bytes: int
    bandwidth: str
    timings: dict[str, Timing]
    more: dict[int, dict[str, Timing]]
    diffs: dict[str, float]
    runs: str
    detail: str
    rows_at: int
    targets_at: int
    kernel_runs: str = ""  # the kernel row's form and build (label)


def measure(ctx: Context, s, length: int, dtype: str, result: SuiteResult) -> Part:
    """Time the attention of one step at context `length` in `dtype` (s: the decode suite's Sizes)."""
    g = torch.Generator().manual_seed(0)
    H, Hkv, D, dt = s.heads, s.kv_heads, s.head_dim, {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    lengths = torch.tensor([length])
    first = filled_cache(lengths, length, s, dt, g)
    nbytes = kv_bytes(first[0], lengths + 1)
    sets = [first] + [filled_cache(lengths, length, s, dt, g) for _ in range(copies_for(nbytes, s) - 1)]
    q = torch.randn(1, H, 1, D, generator=g).to(dt)  # (B, H, 1, D)
    grouped = q.view(1, Hkv, H // Hkv, D)  # (B, Hkv, G, D): the G query heads of each kv head as rows
    big = torch.randn(s.rotation_mib * 2**20 // 4, generator=g)
    turn = Rotation(sets)
    lo, hi, qpos, _ = key_ranges(None, 1, H, 1, length + 1, "cpu")
    bandwidth = f"read bandwidth: sum of {s.rotation_mib} MiB fp32"
    fns = {
        OURS: lambda: mh.attention(q, *turn()),
        PLAIN: lambda: plain_decode_step(q, *turn()[:2], lo, hi, qpos, D**-0.5),
        KERNEL: lambda: decode_step(q, *turn()[:2], lo, hi, qpos, D**-0.5),
        RAW: lambda: F.scaled_dot_product_attention(q, *turn()[:2], enable_gqa=True),
        GROUPED: lambda: F.scaled_dot_product_attention(grouped, *turn()[:2]),
        bandwidth: big.sum,
    }
    untimed = {bandwidth: lambda: mh.attention(q, *turn())}  # the call right after a large sum() runs slower
    timings = compare(fns, rounds=2 * ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s, after=untimed)
    more, threads, clock = {}, torch.get_num_threads(), clock_name()
    for n in (n for n in s.threads if n != threads):  # ours and the bandwidth again at n threads
        torch.set_num_threads(n)
        set_clock("wall")  # a CPU clock would add up the threads' time
        try:
            more[n] = compare({OURS: fns[OURS], bandwidth: big.sum}, rounds=2 * ctx.rounds, warmup=ctx.warmup,
                              budget_s=ctx.budget_s, after=untimed)
        finally:
            torch.set_num_threads(threads)
            set_clock(clock)
    ours = mh.attention(q, *first)
    diffs = {RAW: F.scaled_dot_product_attention(q, *first[:2], enable_gqa=True),
             GROUPED: F.scaled_dot_product_attention(grouped, *first[:2]).view_as(q),
             PLAIN: plain_decode_step(q, *first[:2], lo, hi, qpos, D**-0.5),
             KERNEL: decode_step(q, *first[:2], lo, hi, qpos, D**-0.5)}
    decision = mh.dispatch(q, *first)
    return Part(f"decode N={length} {dtype}: attention", nbytes, big.numel() * 4, bandwidth, timings, more,
                {name: (out - ours).abs().max().item() for name, out in diffs.items()}, label(decision.backend, dt),
                decision.detail, len(result.rows), len(result.targets), label("decode", dt))


def label(backend: str, dt: torch.dtype) -> str:
    """The backend's name; for decode, with the form and the kernel build that run (e.g. 'decode, avx2 build')."""
    if backend != "decode":
        return backend
    isa = kernel_build(dt)
    return f"decode, {isa} build" if isa else "decode, plain-torch form"


class Rotation:
    """Inputs that take turns: each call, from any timed function, gets the next set in the list."""

    def __init__(self, items: list):
        self.items, self.turn = items, 0

    def __call__(self):
        self.turn = (self.turn + 1) % len(self.items)
        return self.items[self.turn]


def copies_for(nbytes: int, sizes) -> int:
    """How many copies of `nbytes` span `sizes.rotation_mib` (at least one)."""
    return max(1, math.ceil(sizes.rotation_mib * 2**20 / nbytes))


def filled_cache(lengths: torch.Tensor, longest: int, s, dtype: torch.dtype, g: torch.Generator):
    """A KVCache (B, Hkv, longest + 1, D) holding `lengths` random tokens per sequence plus one more
    (the step's), and the step's (keys, values, mask) from that last append."""
    B, Hkv, D = len(lengths), s.kv_heads, s.head_dim
    cache = KVCache(B, longest + 1, Hkv, D, dtype=dtype)
    kv = [torch.randn(B, Hkv, longest, D, generator=g).to(dtype) for _ in range(2)]
    cache.append(*kv, None if bool((lengths == longest).all()) else lengths)
    return cache.append(*(torch.randn(B, Hkv, 1, D, generator=g).to(dtype) for _ in range(2)))


def kv_bytes(keys: torch.Tensor, lengths: torch.Tensor) -> int:
    """Bytes of K and V a step must read: every valid token of every sequence and kv head."""
    return 2 * int(lengths.sum()) * keys.shape[1] * keys.shape[3] * keys.element_size()


def run_bandwidth(parts: list[Part], threads: int | None = None) -> tuple[float, int]:
    """(bytes/s, rounds): the median rate of every part's bandwidth rounds, at the suite's thread count or
    at `threads`."""
    rates = [p.big_bytes / x for p in parts
             for x in (p.timings if threads is None else p.more[threads])[p.bandwidth].samples]
    return statistics.median(rates), len(rates)


def report(parts: list[Part], result: SuiteResult) -> None:
    """Each part's rows and target, at the places where the parts ran, against the run's one bandwidth;
    a note with the run's bandwidth and each part's own."""
    if not parts:
        return
    rate, rounds = run_bandwidth(parts)
    more = {n: run_bandwidth(parts, n)[0] for n in parts[0].more}
    for part in reversed(parts):  # later places first, so that earlier ones stay where they were
        rows, target = _rows(part, rate, more), _target(part, rate, rounds)
        result.rows[part.rows_at:part.rows_at] = rows
        result.targets.insert(part.targets_at, target)
    own = {p.case.split(": ")[0]: p.big_bytes / p.timings[p.bandwidth].median_s for p in parts}
    off = [f"{case} ({r / 1e9:.1f} GB/s, {r / rate - 1:+.0%})" for case, r in own.items() if abs(r / rate - 1) > OFF]
    result.notes.append(
        f"read bandwidth: one for the whole run, {rate / 1e9:.1f} GB/s (the median of {rounds} rounds of "
        f"{parts[0].bandwidth[len('read bandwidth: '):]} over {len(parts)} parts)"
        + "".join(f", {r / 1e9:.1f} GB/s at {n} threads" for n, r in more.items())
        + "; every share divides by it. Each part's own rounds: "
        + ", ".join(f"{case} {r / 1e9:.1f}" for case, r in own.items()) + " GB/s"
        + (f"; more than {OFF:.0%} off the run's: " + "; ".join(off) if off else ""))


def _share(nbytes: int, timing: Timing, rate: float) -> float:
    return nbytes / timing.median_s / rate


def _rows(part: Part, rate: float, more: dict[int, float]) -> list[dict]:
    t, out = part.timings, []
    for name, timing in t.items():
        is_bw = name == part.bandwidth
        moved = part.big_bytes if is_bw else part.nbytes
        out.append({
            "case": part.case, "implementation": name + (" (this part's rounds)" if is_bw else ""),
            "ms": timing.median_s * 1e3, "GB/s": moved / timing.median_s / 1e9,
            "% of bandwidth": 100 * _share(moved, timing, rate),
            "x ours": None if is_bw else ratio(timing, t[OURS]), "max |diff|": part.diffs.get(name),
            "runs": part.runs if name == OURS else part.kernel_runs if name == KERNEL else "",
        })
    for n, tn in part.more.items():
        own = part.big_bytes / tn[part.bandwidth].median_s
        out.append({
            "case": part.case, "implementation": f"{OURS}, {n} threads", "ms": tn[OURS].median_s * 1e3,
            "GB/s": part.nbytes / tn[OURS].median_s / 1e9, "% of bandwidth": 100 * _share(part.nbytes, tn[OURS], more[n]),
            "x ours": ratio(tn[OURS], t[OURS]),
            "runs": f"{part.runs} ({n} threads, wall clock; the run's bandwidth at {n} threads {more[n] / 1e9:.1f} GB/s, "
                    f"this part's {own / 1e9:.1f} GB/s)"})
    return out


def _target(part: Part, rate: float, rounds: int) -> Target:
    t = part.timings
    shares = {name: _share(part.nbytes, t[name], rate) for name in (OURS, RAW, GROUPED, PLAIN, KERNEL)}
    own = part.big_bytes / t[part.bandwidth].median_s
    return Target(
        f"{part.case.replace(': attention', '')}: attention reads K/V at this share of the read bandwidth",
        shares[OURS], ">=", SHARE_GOAL,
        note=(f"{part.nbytes / 2**20:.0f} MiB of K/V per step; the run's read bandwidth {rate / 1e9:.1f} GB/s "
              f"(median of {rounds} rounds, every part), this part's rounds {own / 1e9:.1f} GB/s; raw SDPA "
              f"{shares[RAW]:.0%}, grouped queries {shares[GROUPED]:.0%}, plain-torch form {shares[PLAIN]:.0%}, "
              f"the kernel alone {shares[KERNEL]:.0%}; {part.detail}"))
