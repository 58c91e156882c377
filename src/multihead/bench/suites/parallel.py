"""Parallel: ring and Ulysses attention on 1, 2 and 4 local gloo processes, against one process.

B=1, N=4096, H=8, D=64, causal, fp32 (self-attention q, k, v of shape (B, H, N, D), each rank
holding its zig-zag shard). For each world size P, a fresh group of P processes measures on every
rank:

    bytes sent   counted in the collectives (multihead.parallel.traffic) against the model
                 (multihead.parallel.cost): forward, and forward+backward
    peak memory  the rise of the process's peak RSS over its RSS before the call (the peak is reset
                 through /proc/self/clear_refs before each call, and freed blocks go back to the
                 OS at once), the largest over ranks
    time         medians of interleaved rounds, the slowest rank's

"one process" is mh.attention on the whole tensors (SDPA's flash kernel) in a group of one.
Every process runs one torch thread. On this 2-core machine P=1 uses one core, P=2 both, and P=4
puts two processes on each core. (With two threads, a single process's many small tile operations
stall on a loaded machine: each waits for the other thread to be scheduled.) The times say what
sharding costs here, not what it would gain on separate devices; docs/parallel.md projects the
counted bytes onto NVLink and InfiniBand instead.
"""
from __future__ import annotations

import functools
import gc
import os
from dataclasses import asdict, dataclass

import torch

import multihead as mh
from multihead.bench.memory import status_bytes
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare
from multihead.parallel import cost, ring_attention, shard_sequence, ulysses_attention
from multihead.parallel.launch import run_local
from multihead.parallel.layout import shard_lengths
from multihead.parallel.ring import TILE
from multihead.parallel.traffic import count_traffic

MIB, KIB = 1024**2, 1024
PASSES = ("forward", "forward+backward")


@dataclass(frozen=True)
class Sizes:
    length: int
    batch: int = 1
    heads: int = 8
    head_dim: int = 64
    causal: bool = True
    layout: str = "zigzag"  # the layout that balances causal work
    world_sizes: tuple[int, ...] = (1, 2, 4)

    @classmethod
    def full(cls) -> Sizes:
        return cls(4096)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(1024)


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    s = sizes
    result = SuiteResult(
        "parallel",
        f"Parallel: B={s.batch}, N={s.length}, H={s.heads}, D={s.head_dim}, {'causal' if s.causal else 'full'}, "
        f"fp32, gloo on {os.cpu_count()} cores; bytes and memory per rank",
        ["P", "method", "pass", "ms", "x one process", "sent KiB/rank", "model KiB/rank", "counted / model",
         "peak MiB/rank", "x one process mem"],
    )
    measured = {}
    with ctx.bars.task("parallel", total=len(s.world_sizes)) as steps:
        for P in s.world_sizes:
            steps.describe(f"parallel P={P}")
            per_rank = run_local(measure_rank, P, asdict(s), ctx.rounds, ctx.warmup, threads=1,
                                 timeout_s=900, collective_timeout_s=300)
            measured[P] = _slowest(per_rank)
            steps.advance()
    base = measured.get(1, {})
    for P, rows in measured.items():
        for (method, pass_), m in rows.items():
            ref = base.get(("one process", pass_), {})
            result.rows.append({
                "P": P, "method": method, "pass": pass_, "ms": m["ms"],
                "x one process": m["ms"] / ref["ms"] if ref else None,
                "sent KiB/rank": m["sent"] / KIB, "model KiB/rank": m["model"] / KIB,
                "counted / model": m["sent"] / m["model"] if m["model"] else None,
                "peak MiB/rank": m["peak"] / MIB if m["peak"] is not None else None,
                "x one process mem": m["peak"] / ref["peak"] if ref.get("peak") and m["peak"] is not None else None,
            })
    result.targets = _targets(result.rows, s)
    result.notes = _notes(s, measured)
    return result


def measure_rank(spec: dict, rounds: int, warmup: int) -> dict:
    """On one rank: bytes, peak memory and time of each method and pass. {"method|pass": {...}}."""
    import torch.distributed as dist

    s = Sizes(**{**spec, "world_sizes": tuple(spec["world_sizes"])})
    P, rank = dist.get_world_size(), dist.get_rank()
    exact_rss = _return_freed_memory()
    g = torch.Generator().manual_seed(0)
    local = [shard_sequence(torch.randn(s.batch, s.heads, s.length, s.head_dim, generator=g), layout=s.layout)
             .contiguous() for _ in range(3)]  # (B, H, N/P, D): only this rank's shard stays alive
    leaves = [t.clone().requires_grad_() for t in local]
    methods = {"ring": functools.partial(ring_attention, layout=s.layout),
               "ulysses": functools.partial(ulysses_attention, layout=s.layout)}
    if P == 1:
        methods = {"one process": mh.attention, **methods}
    shape = dict(B=s.batch, Hkv=s.heads, D=s.head_dim, Dv=s.head_dim, N=s.length, P=P, rank=rank, layout=s.layout,
                 item=4)
    models = {"ring": lambda bwd: cost.ring_bytes(**shape, backward=bwd),
              "ulysses": lambda bwd: cost.ulysses_bytes(**shape, H=s.heads, backward=bwd),
              "one process": lambda bwd: 0}
    calls = {}
    for name, fn in methods.items():
        calls[(name, "forward")] = lambda fn=fn: _no_grad(fn, local, s.causal)
        calls[(name, "forward+backward")] = lambda fn=fn: _step(fn, leaves, s.causal)
    out = {}
    for (name, pass_), call in calls.items():
        with count_traffic() as traffic:
            call()
        checks = traffic.sent["all_gather"]  # the per-call shape agreement
        out[f"{name}|{pass_}"] = {"sent": traffic.total - checks, "checks": checks,
                                  "model": models[name](pass_ != "forward"),
                                  "peak": _peak_rise(call) if exact_rss else None}
    times = compare({f"{n}|{p}": c for (n, p), c in calls.items()}, rounds=rounds, warmup=warmup, budget_s=None)
    for key, t in times.items():
        out[key]["ms"] = t.median_s * 1e3
    return out


def _no_grad(fn, tensors, causal):
    with torch.no_grad():
        return fn(*tensors, causal=causal)


def _step(fn, leaves, causal):
    """Forward, sum, and the gradients of this rank's q, k, v."""
    torch.autograd.grad(fn(*leaves, causal=causal).sum(), leaves)


def _return_freed_memory() -> bool:
    """Make the C allocator hand every block of 64 KiB or more back to the OS when it is freed.

    By default glibc raises its mmap threshold after large frees and keeps later blocks of that size
    on its heap, resident after they are freed; the RSS would then hide what a call allocates. With
    a fixed threshold, RSS follows the live tensors. False where this is not glibc.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
        return bool(libc.mallopt(M_MMAP_THRESHOLD, 64 * 1024)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 128 * 1024))
    except (OSError, AttributeError, TypeError):
        return False


def _peak_rise(call) -> int | None:
    """Bytes the process's peak RSS rose above its RSS while `call` ran; None where it cannot be reset."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        return None
    before = status_bytes("VmRSS")
    call()
    peak = status_bytes("VmHWM")
    return None if before is None or peak is None else max(0, peak - before)


def _slowest(per_rank: list[dict]) -> dict:
    """Per (method, pass): the slowest rank's time and the largest bytes and peak over ranks."""
    merged = {}
    for key in per_rank[0]:
        method, pass_ = key.split("|")
        values = [r[key] for r in per_rank]
        peaks = [v["peak"] for v in values if v["peak"] is not None]
        merged[(method, pass_)] = {"ms": max(v["ms"] for v in values), "sent": max(v["sent"] for v in values),
                                   "model": max(v["model"] for v in values), "checks": max(v["checks"] for v in values),
                                   "peak": max(peaks) if len(peaks) == len(values) else None}
    return merged


def ring_allowance(s: Sizes, P: int) -> dict[str, int]:
    """What the ring holds beyond its 1/P share, by design, in bytes: O(block), not O(N).

    blocks: eight buffers the size of one rank's K (or V) shard in float32: the K and V blocks in
    hand (after the first step they are received ones) and the next K and V arriving; dK and dV
    travelling and the next dK and dV arriving. tiles: two (B, H, T, T) float32 score buffers.
    """
    block = s.batch * s.heads * max(shard_lengths(s.length, P, s.layout)) * s.head_dim * 4
    tile = min(TILE, s.length)
    return {"blocks": 8 * block, "tiles": 2 * s.batch * s.heads * tile * tile * 4}


def _targets(rows: list[dict], s: Sizes) -> list[Target]:
    gaps = [abs(r["counted / model"] - 1) for r in rows if r["counted / model"] is not None]
    targets = [Target("bytes counted in the collectives vs the model: largest relative gap",
                      max(gaps) if gaps else None, "<=", 0.0, note="every P, method and pass; multihead.parallel.cost")]
    P = max(s.world_sizes)

    def row(p, method):
        return next((r for r in rows if (r["P"], r["method"], r["pass"]) == (p, method, "forward+backward")), None)

    one, ring = row(1, "one process"), row(P, "ring")
    allowance = ring_allowance(s, P)
    value = None
    if P > 1 and one and ring and one["peak MiB/rank"] and ring["peak MiB/rank"] is not None:
        value = ring["peak MiB/rank"] / (one["peak MiB/rank"] / P + sum(allowance.values()) / MIB)
    note = (f"O(block) allowed: 8 K/V-shard buffers in flight ({allowance['blocks'] / MIB:.0f} MiB) + 2 score "
            f"tiles ({allowance['tiles'] / MIB:.0f} MiB)")
    targets.append(Target(f"ring forward+backward peak per rank, P={P} / (one process / P + O(block))", value,
                          "<=", 1.0, note=note))
    return targets


def _notes(s: Sizes, measured: dict) -> list[str]:
    checks = {P: rows[("ring", "forward")]["checks"] for P, rows in measured.items() if ("ring", "forward") in rows}
    return [
        f"one torch thread per process on {os.cpu_count()} cores: P=1 uses one core, P=2 two, P=4 shares them "
        "(two processes per core).",
        "sent: bytes this rank puts on the wire (all-to-all less its own chunk; p2p sends), the largest over "
        "ranks; the per-call shape check (one small all_gather) is left out: "
        + ", ".join(f"P={P}: {b} B" for P, b in checks.items()) + ".",
        "peak: the rise of peak RSS over RSS before the call, largest over ranks; 'one process' holds the whole "
        "sequence, the ranks 1/P of it plus what the method keeps in flight.",
        "x one process: against mh.attention (SDPA flash) in one process on one core; ring computes its tiles "
        "with plain float32 matrix products, not a fused kernel.",
    ]


DRAWN_COLUMNS = ("sent KiB/rank", "peak MiB/rank", "ms")


def plot(plt, r: SuiteResult):
    """Bytes, memory and time per rank against P, one line per method and pass."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    series = sorted({(row["method"], row["pass"]) for row in r.rows})
    for ax, col in zip(axes, DRAWN_COLUMNS):
        for method, pass_ in series:
            pts = [(row["P"], row[col]) for row in r.rows
                   if (row["method"], row["pass"]) == (method, pass_) and row[col] is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{method} {pass_}")
        ax.set_xlabel("P (processes)")
        ax.set_ylabel(col)
        ax.set_xticks(sorted({row["P"] for row in r.rows}))
    axes[0].legend(fontsize=7)
    fig.suptitle(r.title, fontsize=9)
    return fig
