"""Small: decode-like shapes (B=1, L=8) where Python overhead, not arithmetic, sets the time.

Ours (module, then the functional core) against the same work done by hand: the floor module (the
fastest of the shootout's four minimal implementations, measured in the same rounds) and a bare SDPA
call. Each sample times a loop of calls, and the suite takes ROUND_FACTOR times the usual rounds:
its samples are short and read the weights from memory, so bursts from other jobs move them most.
Two masks: causal, and a key-padding mask. The functional core is measured the way a model uses it,
with a Mask built once (`mh.attention(q, k, v, mask)`), against raw SDPA given the same mask; its goals
are the ratios ATTENTION_GOALS. The module builds its Mask per call, as a user's forward does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench.peers import FLOOR_VARIANTS, MinimalAttention, Shape, fastest_variants
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio, ratio_range

GOAL = 1.2
ROUND_FACTOR = 4
# mh.attention with a prebuilt Mask / raw SDPA, per mask
ATTENTION_GOALS = {"causal": 1.15, "key padding": 1.5}
# what the time outside the kernel is, per mask (said with each target, met or not)
BOUNDED_BY = {
    "causal": "outside the kernel: the plan cache's lookup (Python), and on CPU one sum of q read on the host that "
              "keeps a NaN query row NaN (the CPU flash kernel returns it as zeros)",
    "key padding": "outside the kernel: the plan cache's lookup (Python); the one row's padding is read once per "
                   "plan and only its kept keys are passed, with no mask, then the NaN-row pass",
}


@dataclass(frozen=True)
class Sizes:
    shape: Shape
    calls: int  # calls per timed sample

    @classmethod
    def full(cls) -> Sizes:
        return cls(Shape(batch=1, length=8, embed=768, heads=12), calls=200)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(Shape(batch=1, length=8, embed=768, heads=12), calls=50)


def _loop(fn, calls: int):
    def many():
        for _ in range(calls):
            fn()
    return many


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    s = sizes.shape
    B, N, H, D = s.batch, s.length, s.heads, s.head_dim
    x = s.input()
    ours = mh.MultiHeadAttention(s.embed, s.heads).eval()
    floors = {name: MinimalAttention(s.embed, s.heads, True, fused_qkv=fused, contiguous=contiguous).eval()
              for name, (fused, contiguous) in FLOOR_VARIANTS.items()}
    q, k, v = (t.contiguous() for t in torch.randn(3, B, H, N, D))  # (B, H, N, D) each
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[:, -2:] = True  # the last two keys are padding
    keep = ~pad[:, None, None, :]  # (B, 1, 1, N) SDPA's True = attend
    padding = mh.Mask.key_padding(pad)  # built once, as a model reuses it across layers and steps
    cases = {
        "causal": {
            "ours module": lambda: ours(x, causal=True),
            **{name: (lambda m=m: m(x)) for name, m in floors.items()},
            "ours attention()": lambda: mh.attention(q, k, v, causal=True),
            "raw SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        },
        "key padding": {
            "ours module": lambda: ours(x, mask=mh.Mask.key_padding(pad)),
            **{name: (lambda m=m: m(x, keep)) for name, m in floors.items()},
            "ours attention()": lambda: mh.attention(q, k, v, padding),
            "raw SDPA": lambda: F.scaled_dot_product_attention(q, k, v, keep),
        },
    }
    result = SuiteResult(
        "small", f"Small: B={B}, L={N}, E={s.embed}, H={H}, fp32 forward, microseconds per call",
        ["mask", "implementation", "us", "x its baseline", "baseline"],
    )
    rounds = ROUND_FACTOR * ctx.rounds
    with ctx.bars.task("small", total=rounds * len(cases)) as steps, torch.no_grad():
        for label, fns in cases.items():
            t = compare({n: _loop(f, sizes.calls) for n, f in fns.items()}, rounds=rounds,
                        warmup=ctx.warmup, budget_s=ctx.budget_s, on_round=steps.advance)
            floor = fastest_variants({n: x for n, x in t.items() if n in FLOOR_VARIANTS})["floor"]
            baselines = {"ours module": floor, "ours attention()": "raw SDPA"}
            for name, timing in t.items():
                base = baselines.get(name)
                result.rows.append({"mask": label, "implementation": name,
                                    "us": timing.median_s / sizes.calls * 1e6,
                                    "x its baseline": ratio(timing, t[base]) if base else None,
                                    "baseline": base or ""})
            for ours_name, base in baselines.items():
                lo, hi = ratio_range(t[ours_name], t[base])
                what = f"floor = {floor}, the fastest of 4 minimal variants; " if base == floor else ""
                goal = GOAL if base == floor else ATTENTION_GOALS[label]
                bound = "" if base == floor else f"; {BOUNDED_BY[label]}"
                result.targets.append(Target(f"small {label}: {ours_name} / {'floor module' if base == floor else base}",
                                             ratio(t[ours_name], t[base]), "<=", goal,
                                             note=f"{what}per-round ratios {lo:.2f} to {hi:.2f}{bound}"))
    return result
