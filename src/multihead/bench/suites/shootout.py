"""Shootout: ours against every peer on one causal self-attention, forward and forward+backward.

Raschka's comparison configuration: B=8, N=1024, E=768, H=12, causal, fp32. Every peer gets its
best call: masks and layouts are prepared once, forward runs under no_grad in eval mode (torch's
fast path may take it), forward+backward sums the output and backpropagates into the parameters.
"""
from __future__ import annotations

from dataclasses import dataclass

from multihead.bench.peers import Shape
from multihead.bench.registry import build, names
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio

TORCH_DEFAULT = "nn.MultiheadAttention"


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
    result = SuiteResult(
        "shootout",
        f"Shootout: B={s.batch}, N={s.length}, E={s.embed}, H={s.heads}, causal, {_dtype(s)}",
        ["implementation", "forward ms", "forward x ours", "fwd+bwd ms", "fwd+bwd x ours", "note"],
    )
    for name, r in runners.items():
        row = {"implementation": name, "note": r.note}
        for label, short in (("forward", "forward"), ("forward+backward", "fwd+bwd")):
            t = times[label]
            row[f"{short} ms"] = t[name].median_s * 1e3
            row[f"{short} x ours"] = ratio(t[name], t["ours"])
        result.rows.append(row)
    result.targets = targets(times)
    return result


def targets(times: dict) -> list[Target]:
    """P1 for each pass: ours <= 1.05x floor, >= 1.8x faster than torch's default, fastest peer."""
    found = []
    for label, t in times.items():
        others = {n: ratio(x, t["ours"]) for n, x in t.items() if n not in ("ours", "floor")}
        closest = min(others, key=others.get)
        found += [
            Target(f"P1 {label}: ours / floor", ratio(t["ours"], t["floor"]), "<=", 1.05),
            Target(f"P1 {label}: {TORCH_DEFAULT} default / ours", others[TORCH_DEFAULT], ">=", 1.8),
            Target(f"P1 {label}: closest other peer / ours", others[closest], ">=", 1.0,
                   note=f"closest: {closest}"),
        ]
    return found


def _dtype(s: Shape) -> str:
    return str(s.dtype).replace("torch.", "")
