"""Roofline: what this machine can do, and how much of it each attention core gets.

Measured in one interleaved comparison: the square GEMM rate (fp32 and bf16), the copy bandwidth, and
each attention core's FLOP rate at N=4096 (B=1, H=8, D=64), counted the flash-attn way:
4 * B * H * Lq * Lk * D per forward, half of that when causal. Two more measurements say what bounds
the fused kernel: the time of the softmax's exp over all H * N^2 scores alone (in cache-sized tiles),
and the cost of causal over half of non-causal (work done on tiles that cross the diagonal).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import Timing, compare, ratio
from multihead.textbook import ClassicTransformerHeads

P3_GOAL = 0.90
EXP_TILE = 1 << 17  # floats per exp call: 512 KiB, stays in L2


@dataclass(frozen=True)
class Sizes:
    gemm: int  # square matrix size
    copy_mib: int  # bytes copied per bandwidth call
    length: int  # attention N
    heads: int = 8
    head_dim: int = 64

    @classmethod
    def full(cls) -> Sizes:
        return cls(gemm=2048, copy_mib=256, length=4096)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(gemm=1024, copy_mib=64, length=1024)


def attention_flops(batch: int, heads: int, lq: int, lk: int, head_dim: int, causal: bool) -> float:
    """4 * B * H * Lq * Lk * D, halved for causal (the flash-attn convention)."""
    flops = 4.0 * batch * heads * lq * lk * head_dim
    return flops / 2 if causal else flops


def workloads(sizes: Sizes) -> dict[tuple[str, str, bool | None], object]:
    """{(measurement, dtype, causal): callable}: machine rates, attention cores, the exp pass."""
    n, H, N, D = sizes.gemm, sizes.heads, sizes.length, sizes.head_dim
    g = torch.Generator().manual_seed(0)
    a32, b32 = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    a16, b16 = a32.bfloat16(), b32.bfloat16()
    src = torch.randn(sizes.copy_mib * 1024**2 // 4, generator=g)
    dst = torch.empty_like(src)
    q32, k32, v32 = (torch.randn(1, H, N, D, generator=g) for _ in range(3))  # (1, H, N, D)
    q16, k16, v16 = (t.bfloat16() for t in (q32, k32, v32))
    q128, k128, v128 = (t.reshape(1, H // 2, N, 2 * D) for t in (q32, k32, v32))  # (1, H/2, N, 2D)
    book = ClassicTransformerHeads(H * D, H)
    causal_keep = torch.ones(N, N, dtype=torch.bool).tril()  # (N, N), document 002's 0 = blocked
    tile, tile_out = torch.randn(EXP_TILE, generator=g), torch.empty(EXP_TILE)

    threads = torch.get_num_threads()

    def exp_over_scores():
        """One thread's share of the exps, on one thread: the time of a perfectly split pass.

        Many short parallel calls would measure barrier waits instead whenever the machine is busy.
        """
        torch.set_num_threads(1)
        try:
            for _ in range(max(1, H * N * N // EXP_TILE // threads)):
                torch.exp(tile, out=tile_out)
        finally:
            torch.set_num_threads(threads)

    fns = {
        ("GEMM", "fp32", None): lambda: torch.mm(a32, b32),
        ("GEMM", "bf16", None): lambda: torch.mm(a16, b16),
        ("copy bandwidth", "fp32", None): lambda: dst.copy_(src),
        ("exp over the H*N^2 scores alone", "fp32", None): exp_over_scores,
        (f"attention ours, D={2 * D}, H={H // 2}", "fp32", False): lambda: mh.attention(q128, k128, v128),
    }
    for c in (False, True):
        fns[("attention ours", "fp32", c)] = lambda c=c: mh.attention(q32, k32, v32, causal=c)
        fns[("attention raw SDPA", "fp32", c)] = lambda c=c: F.scaled_dot_product_attention(
            q32, k32, v32, is_causal=c)
        fns[("attention ours", "bf16", c)] = lambda c=c: mh.attention(q16, k16, v16, causal=c)
        fns[("attention 002 textbook core", "fp32", c)] = lambda c=c: book.scaled_dot_product_attention(
            q32, k32, v32, causal_keep if c else None)
    return fns


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    n, H, N, D = sizes.gemm, sizes.heads, sizes.length, sizes.head_dim
    result = SuiteResult(
        "roofline",
        f"Roofline: GEMM {n}^2, copy {sizes.copy_mib} MiB, attention B=1 H={H} N={N} D={D}",
        ["measurement", "dtype", "causal", "ms", "rate", "unit", "% of GEMM"],
    )
    fns = workloads(sizes)
    with ctx.bars.task("roofline", total=ctx.rounds) as steps, torch.no_grad():
        t = compare(fns, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s,
                    on_round=steps.advance)
    sec = {key: x.median_s for key, x in t.items()}
    gemm = {dt: 2.0 * n**3 / sec[("GEMM", dt, None)] for dt in ("fp32", "bf16")}
    for key, s in sec.items():
        name, dtype, causal = key
        row = {"measurement": name, "dtype": dtype, "causal": causal, "ms": s * 1e3}
        if name == "copy bandwidth":
            row.update(rate=2.0 * sizes.copy_mib * 1024**2 / s / 1e9, unit="GB/s")  # read + write
        elif name.startswith("exp"):
            row.update(unit="")
        else:
            flops = 2.0 * n**3 if name == "GEMM" else attention_flops(1, H, N, N, D, causal)
            row.update(rate=flops / s / 1e9, unit="GFLOP/s", **{"% of GEMM": 100.0 * flops / s / gemm[dtype]})
        result.rows.append(row)
    result.targets = p3_targets(sizes, t)
    return result


def p3_targets(sizes: Sizes, t: dict[tuple, Timing]) -> list[Target]:
    """P3 for non-causal and causal (per-round ratios to the GEMM), each with what bounds it.

    Same FLOPs with D doubled and H halved means half the scores: the time saved is half the
    per-score work (softmax: scale, max, exp, sum, rescale). The rest is the matrix products.
    """
    n, H, N, D = sizes.gemm, sizes.heads, sizes.length, sizes.head_dim
    gemm = t[("GEMM", "fp32", None)]
    t64 = t[("attention ours", "fp32", False)].median_s
    t128 = t[(f"attention ours, D={2 * D}, H={H // 2}", "fp32", False)].median_s
    per_score = min(max(2 * (t64 - t128), 0.0), t64)  # seconds of per-score work at D
    gemm_rate = 2.0 * n**3 / gemm.median_s
    products = attention_flops(1, H, N, N, D, False) / max(t64 - per_score, 1e-12) / gemm_rate
    exps = t[("exp over the H*N^2 scores alone", "fp32", None)].median_s
    excess = 2 * ratio(t[("attention ours", "fp32", True)], t[("attention ours", "fp32", False)])
    found = []
    for causal in (False, True):
        flops = attention_flops(1, H, N, N, D, causal)
        share = flops / (2.0 * n**3) * ratio(gemm, t[("attention ours", "fp32", causal)])
        note = (f"per-score softmax work is {per_score / t64:.0%} of the D={D} kernel time "
                f"({per_score / exps:.1f}x a bare exp pass); its matrix products run at "
                f"{products:.0%} of the GEMM rate")
        if causal:
            note += f"; causal costs {excess:.2f}x half of non-causal (key tiles across the diagonal)"
        kind = "causal" if causal else "non-causal"
        found.append(Target(f"P3 attention core N={N} {kind}: share of fp32 GEMM rate", share, ">=",
                            P3_GOAL, note=note))
    return found
