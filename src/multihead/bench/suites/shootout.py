"""Shootout: ours against every peer on one causal self-attention, forward and forward+backward.

Raschka's comparison configuration: B=8, N=1024, E=768, H=12, causal, fp32. Every peer gets its
best call: masks and layouts are prepared once; forward runs under no_grad, forward+backward sums
the output and backpropagates into the parameters. A peer that a user can call in several ways
(nn.MultiheadAttention's modes) is timed in each, and its fastest variant is the one compared. The
floor is the fastest of four minimal implementations (fused or separate QKV GEMMs, strided or
contiguous q/k/v, SDPA inside), measured in the same interleaved rounds. Each row's "runs" column is
what torch's dispatcher saw during one call, not what the code is believed to do.
"""
from __future__ import annotations

from dataclasses import dataclass

from multihead.bench.peers import TORCH_DEFAULT, Shape, family, fastest_variants
from multihead.bench.registry import build, names
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import Timing, compare, ratio, ratio_range

FLOOR_GOAL, TORCH_DEFAULT_GOAL = 1.05, 1.8


@dataclass(frozen=True)
class Sizes:
    shape: Shape

    @classmethod
    def full(cls) -> Sizes:
        return cls(Shape(batch=8, length=1024, embed=768, heads=12))

    @classmethod
    def quick(cls) -> Sizes:
        return cls(Shape(batch=2, length=256, embed=256, heads=4))


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    s = sizes.shape
    runners = {name: build(name, s) for name in names()}
    passes = {"forward": lambda r: r.forward, "forward+backward": lambda r: r.forward_backward}
    times = {}
    with ctx.bars.task("shootout", total=ctx.rounds * len(passes)) as steps:
        for label, pick in passes.items():
            steps.describe(f"shootout {label}")
            fns = {name: pick(r) for name, r in runners.items()}
            times[label] = compare(fns, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s,
                                   on_round=steps.advance)
    best = {label: fastest_variants(t) for label, t in times.items()}
    result = SuiteResult(
        "shootout",
        f"Shootout: B={s.batch}, N={s.length}, E={s.embed}, H={s.heads}, causal, {_dtype(s)}",
        ["implementation", "forward ms", "forward x ours", "fwd+bwd ms", "fwd+bwd x ours",
         "fastest variant in", "runs"],
    )
    for name, r in runners.items():
        row = {"implementation": name}
        for label, short in (("forward", "forward"), ("forward+backward", "fwd+bwd")):
            t = times[label]
            row[f"{short} ms"] = t[name].median_s * 1e3
            row[f"{short} x ours"] = ratio(t[name], t["ours"])
        wins = [short for label, short in (("forward", "forward"), ("forward+backward", "fwd+bwd"))
                if "[" in name and best[label][family(name)] == name]
        row["fastest variant in"] = ", ".join(wins)
        row["runs"] = "; ".join(x for x in (r.what_runs(), r.note) if x)
        result.rows.append(row)
    result.targets = [t for label in times for t in targets(label, times[label], best[label])]
    return result


def targets(label: str, t: dict[str, Timing], best: dict[str, str]) -> list[Target]:
    """P1 for one pass: ours <= 1.05x the floor, >= 1.8x faster than torch's default call, and no
    other peer (each at its fastest variant) faster than ours."""
    floor = best["floor"]
    lo, hi = ratio_range(t["ours"], t[floor])
    others = {best[fam]: ratio(t[best[fam]], t["ours"]) for fam in best if fam not in ("ours", "floor")}
    closest = min(others, key=others.get)
    return [
        Target(f"P1 {label}: ours / floor", ratio(t["ours"], t[floor]), "<=", FLOOR_GOAL,
               note=f"floor = {floor}, the fastest of 4 minimal variants; per-round ratios {lo:.2f} to {hi:.2f}"),
        Target(f"P1 {label}: {TORCH_DEFAULT} / ours", ratio(t[TORCH_DEFAULT], t["ours"]), ">=",
               TORCH_DEFAULT_GOAL, note="need_weights=True, the module's default call"),
        Target(f"P1 {label}: closest other peer / ours", others[closest], ">=", 1.0,
               note=f"closest: {closest} (each peer at its fastest variant)"),
    ]


def _dtype(s: Shape) -> str:
    return str(s.dtype).replace("torch.", "")
