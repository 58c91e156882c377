"""Scaling: time and peak memory as N grows, ours against a textbook class that builds N^2 scores.

B=1, E=512, H=8 (D=64), causal forward. Each (implementation, N) runs in a fresh process that
reports its peak RSS. The textbook class is not started where its predicted score memory
(two (B, H, N, N) float32 tensors alive at once, 4 * N^2 * H bytes each, plus the N^2 bool mask)
is over the memory budget: it would exhaust the machine, so the row says so instead.
"""
from __future__ import annotations

from dataclasses import dataclass

from multihead.bench.memory import GIB, probe, score_tensor_bytes
from multihead.bench.peers import Shape
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.textbook_peers import MATERIALISING_PEER, SCORE_COPIES_ALIVE

P2_LENGTH = 32768
MIB = 1024**2


@dataclass(frozen=True)
class Sizes:
    lengths: tuple[int, ...]
    embed: int = 512
    heads: int = 8
    memory_budget: int = 4 * GIB

    @classmethod
    def full(cls) -> Sizes:
        return cls((512, 1024, 2048, 4096, 8192, 16384, 32768), memory_budget=_default_budget())

    @classmethod
    def quick(cls) -> Sizes:
        return cls((512, 1024), memory_budget=_default_budget())


def predicted_bytes(shape: Shape) -> int:
    """What the materialising textbook peer needs for its scores and its (N, N) bool mask."""
    return SCORE_COPIES_ALIVE * score_tensor_bytes(shape) + shape.length**2


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    result = SuiteResult(
        "scaling",
        f"Scaling: B=1, E={sizes.embed}, H={sizes.heads}, causal forward, fp32, fresh process per cell",
        ["N", "ours ms", "ours peak MiB", f"{MATERIALISING_PEER} ms", "textbook peak MiB", "note"],
    )
    with ctx.bars.task("scaling", total=2 * len(sizes.lengths)) as steps:
        for n in sizes.lengths:
            shape = Shape(batch=1, length=n, embed=sizes.embed, heads=sizes.heads)
            steps.describe(f"scaling N={n}")
            repeats, warmup = (3, 1) if n <= 4096 else (1, 0)
            ours = probe("ours", shape, repeats=repeats, warmup=warmup)
            steps.advance()
            need = predicted_bytes(shape)
            if need > sizes.memory_budget:
                book = {"error": f"not run: predicted {need / GIB:.1f} GiB of scores "
                                 f"({SCORE_COPIES_ALIVE} x 4*N^2*H bytes) > budget "
                                 f"{sizes.memory_budget / GIB:.1f} GiB"}
            else:
                book = probe(MATERIALISING_PEER, shape, repeats=repeats, warmup=warmup)
            steps.advance()
            result.rows.append({
                "N": n,
                "ours ms": _ms(ours),
                "ours peak MiB": _mib(ours),
                f"{MATERIALISING_PEER} ms": _ms(book),
                "textbook peak MiB": _mib(book),
                "note": "; ".join(r["error"] for r in (ours, book) if "error" in r),
            })
    result.targets = [_p2_target(result.rows, sizes)]
    return result


def _p2_target(rows: list[dict], sizes: Sizes) -> Target:
    name = f"P2 peak RSS MiB, N={P2_LENGTH}, E=512, H=8, causal forward"
    row = next((r for r in rows if r["N"] == P2_LENGTH), None)
    if row is None or row["ours peak MiB"] is None or (sizes.embed, sizes.heads) != (512, 8):
        return Target(name, None, "<=", 1024, note="measured by the full suite only")
    return Target(name, row["ours peak MiB"], "<=", 1024, note="whole process, torch included")


def _ms(r: dict) -> float | None:
    return r["seconds"] * 1e3 if "seconds" in r else None


def _mib(r: dict) -> float | None:
    return r["peak_rss"] / MIB if r.get("peak_rss") is not None else None


def _default_budget() -> int:
    """4 GiB, or half of the memory available now when that is less."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return min(4 * GIB, int(line.split()[1]) * 1024 // 2)
    except OSError:
        pass
    return 4 * GIB
