"""Decode suite, part 3: a sliding-window causal prefill, and the helpers for calls that take seconds.

W=1024, N=16384, B=1, H=8, D=64, fp32: `mh.attention(q, k, v, Mask.window(W), causal=True)` against SDPA
with the dense (N, N) bool mask built beforehand, SDPA is_causal without the window, and (with the
compiled peers) FlexAttention with a block mask of the window under torch.compile, and ours under
torch.compile with backend="flex" (on the CPU "auto" does not pick flex under torch.compile: its compiled
kernel fails to build for some masks; the score_mod that keeps NaN rows NaN comes with it).
"""
from __future__ import annotations

import statistics

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import Timing, compare, ratio, time_call

WINDOW_GOAL = 5.0  # dense-masked SDPA / ours


def big_rounds(fns: dict, ctx: Context) -> dict[str, Timing]:
    """Interleaved rounds of calls that take seconds: no warm-up; a first round, then as many more as
    fit in the budget (up to ctx.rounds)."""
    first = {name: time_call(fn) for name, fn in fns.items()}
    more = max(0, min(ctx.rounds, int(ctx.budget_s / max(sum(first.values()), 1e-9))) - 1)
    later = compare(fns, rounds=more, warmup=0) if more else {name: Timing(0.0, ()) for name in fns}
    samples = {name: (first[name], *later[name].samples) for name in fns}
    return {name: Timing(statistics.median(x), x) for name, x in samples.items()}


def keeping(outputs: dict, name: str, fn):
    """fn, storing its latest output in outputs[name] (big calls are checked on a timed output)."""
    def call():
        outputs[name] = fn()
    return call


def window(ctx: Context, s, result: SuiteResult) -> None:
    """Part 3: a sliding-window causal prefill, ours against SDPA with the dense (N, N) mask and compiled
    Flex; s: the decode suite's Sizes (window, window_length, window_heads, window_head_dim, compiled_peers)."""
    N, W, H, D = s.window_length, s.window, s.window_heads, s.window_head_dim
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, H, N, D, generator=g) for _ in range(3))  # (1, H, N, D)
    keep = band_keep(N, W)  # (N, N)
    mask = mh.Mask.window(W)
    baseline, ours, causal = ("dense-masked SDPA, (N, N) bool mask",
                              f"ours: mh.attention, Mask.window({W}) & causal", "SDPA is_causal, no window")
    outs: dict[str, torch.Tensor] = {}
    fns = {
        baseline: keeping(outs, baseline, lambda: F.scaled_dot_product_attention(q, k, v, keep)),
        ours: keeping(outs, ours, lambda: mh.attention(q, k, v, mask, causal=True)),
        causal: lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    flex_name, flex_note = "FlexAttention + block mask, torch.compile", ""
    ours_compiled = "ours under torch.compile, backend='flex'"
    if s.compiled_peers:
        flex_fn, flex_note = compiled_flex(q, k, v, W)
        if flex_fn is not None:
            fns[flex_name] = keeping(outs, flex_name, flex_fn)
            compiled = torch.compile(lambda: mh.attention(q, k, v, mask, causal=True, backend="flex"))
            compiled()  # compiles
            fns[ours_compiled] = keeping(outs, ours_compiled, compiled)
    t = big_rounds(fns, ctx)
    decision = mh.dispatch(q, k, v, mask, causal=True)
    case = f"window prefill N={N} W={W} fp32"
    for name, timing in t.items():
        result.rows.append({
            "case": case, "implementation": name, "ms": timing.median_s * 1e3, "x ours": ratio(timing, t[ours]),
            "max |diff|": ((outs[name] - outs[baseline]).abs().max().item()
                           if name in (ours, flex_name, ours_compiled) else None),
            "runs": {ours: decision.backend, flex_name: "flex, compiled",
                     ours_compiled: "flex, compiled"}.get(name, "SDPA"),
        })
    result.targets.append(Target(
        f"window prefill N={N} W={W}: dense-masked SDPA / ours", ratio(t[baseline], t[ours]), ">=",
        WINDOW_GOAL,
        note=(f"auto runs {decision.backend}; ideal {N * N / band_pairs(N, W):.1f} (N^2 / pairs in the band); "
              f"SDPA is_causal without the window is {ratio(t[baseline], t[causal]):.2f}x faster than dense-masked; "
              f"{len(t[ours].samples)} round(s)")))
    result.notes.append("window prefill, auto: " + "; ".join(line.strip() for line in str(decision).splitlines()))
    if flex_note:
        result.notes.append(flex_note)
    if flex_name in t:
        result.targets.append(Target(
            f"window prefill N={N} W={W}: compiled FlexAttention (block mask) / ours", ratio(t[flex_name], t[ours]),
            ">=", 1.0, note="the strongest peer that also skips the blocks outside the band"))
        result.targets.append(Target(
            f"window prefill N={N} W={W}: compiled FlexAttention (block mask) / ours compiled, backend='flex'",
            ratio(t[flex_name], t[ours_compiled]), ">=", 1.0,
            note="both compiled; ours adds a score_mod that keeps NaN rows NaN (torch's compiled CPU kernel "
                 "reads them as masked)"))


def compiled_flex(q, k, v, W: int):
    """(call, note): flex_attention compiled with a block mask of the causal window, or (None, why not)."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        N = q.shape[2]
        block_mask = create_block_mask(lambda b, h, i, j: (j <= i) & (j > i - W), None, None, N, N, device="cpu")
        flex = torch.compile(flex_attention)
        flex(q, k, v, block_mask=block_mask)  # compiles
        return (lambda: flex(q, k, v, block_mask=block_mask)), ""
    except Exception as e:  # noqa: BLE001 (any failure: the peer is reported as not runnable here)
        why = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        return None, f"compiled FlexAttention with a block mask could not run on this CPU: {why}"


def band_keep(N: int, W: int) -> torch.Tensor:
    """(N, N) bool: query i keeps keys i - W < j <= i (causal, the last W keys)."""
    i = torch.arange(N)
    return (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - W)


def band_pairs(N: int, W: int) -> int:
    """How many (query, key) pairs `band_keep(N, W)` keeps: the work of a path that follows the window."""
    return N * W - W * (W - 1) // 2 if N >= W else N * (N + 1) // 2
