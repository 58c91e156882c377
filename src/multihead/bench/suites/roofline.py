"""Roofline: what this machine can do, and how much of it each attention core gets.

Measured here, in the same run: the square GEMM rate (fp32 and bf16), the copy bandwidth, and each
attention core's FLOP rate at N=4096 (B=1, H=8, D=64), counted the flash-attn way:
4 * B * H * Lq * Lk * D per forward, half of that when causal.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare
from multihead.textbook import ClassicTransformerHeads

P3_GOAL = 0.90


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


def machine_rates(ctx: Context, sizes: Sizes, steps) -> dict[str, float]:
    """{"fp32 GEMM": FLOP/s, "bf16 GEMM": FLOP/s, "copy": bytes/s}."""
    n = sizes.gemm
    mats = {dt: (torch.randn(n, n).to(dt), torch.randn(n, n).to(dt))
            for dt in (torch.float32, torch.bfloat16)}
    src = torch.randn(sizes.copy_mib * 1024**2 // 4)
    dst = torch.empty_like(src)
    t = compare({
        "fp32 GEMM": lambda: torch.mm(*mats[torch.float32]),
        "bf16 GEMM": lambda: torch.mm(*mats[torch.bfloat16]),
        "copy": lambda: dst.copy_(src),
    }, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s, on_round=steps.advance)
    return {
        "fp32 GEMM": 2.0 * n**3 / t["fp32 GEMM"].median_s,
        "bf16 GEMM": 2.0 * n**3 / t["bf16 GEMM"].median_s,
        "copy": 2.0 * src.numel() * 4 / t["copy"].median_s,  # read + write
    }


def core_rates(ctx: Context, sizes: Sizes, steps) -> dict[tuple[str, str, bool], float]:
    """{(implementation, dtype, causal): FLOP/s} for each attention core at N."""
    H, N, D = sizes.heads, sizes.length, sizes.head_dim
    g = torch.Generator().manual_seed(0)
    q32, k32, v32 = (torch.randn(1, H, N, D, generator=g) for _ in range(3))  # (1, H, N, D)
    q16, k16, v16 = (t.bfloat16() for t in (q32, k32, v32))
    book = ClassicTransformerHeads(H * D, H)
    causal_keep = torch.ones(N, N, dtype=torch.bool).tril()  # (N, N), document 002's 0 = blocked
    fns = {}
    for causal in (False, True):
        fns[("ours", "fp32", causal)] = lambda c=causal: mh.attention(q32, k32, v32, causal=c)
        fns[("raw SDPA", "fp32", causal)] = lambda c=causal: F.scaled_dot_product_attention(
            q32, k32, v32, is_causal=c)
        fns[("ours", "bf16", causal)] = lambda c=causal: mh.attention(q16, k16, v16, causal=c)
        fns[("002 textbook core", "fp32", causal)] = lambda c=causal: book.scaled_dot_product_attention(
            q32, k32, v32, causal_keep if c else None)
    # What bounds the fused kernel: its own two GEMM shapes, run alone on materialised scores
    # (inner dim D for q k^T, output width D for p v), and the same work with D doubled.
    p32 = torch.softmax(torch.randn(1, H, N, N, generator=g), dim=-1)  # (1, H, N, N)
    fns[("q k^T + p v GEMMs alone", "fp32", False)] = lambda: (q32 @ k32.transpose(-2, -1), p32 @ v32)
    q128, k128, v128 = (t.reshape(1, H // 2, N, 2 * D) for t in (q32, k32, v32))  # (1, H/2, N, 2D)
    fns[(f"ours, D={2 * D}, H={H // 2}", "fp32", False)] = lambda: mh.attention(q128, k128, v128)
    with torch.no_grad():
        t = compare(fns, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s,
                    on_round=steps.advance)
    return {key: attention_flops(1, H, N, N, D, key[2]) / t[key].median_s for key in fns}


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    result = SuiteResult(
        "roofline",
        f"Roofline: GEMM {sizes.gemm}^2, copy {sizes.copy_mib} MiB, attention B=1 H={sizes.heads} "
        f"N={sizes.length} D={sizes.head_dim}",
        ["measurement", "dtype", "causal", "rate", "unit", "% of GEMM"],
    )
    with ctx.bars.task("roofline", total=2 * ctx.rounds) as steps:
        machine = machine_rates(ctx, sizes, steps)
        cores = core_rates(ctx, sizes, steps)
    result.rows += [
        {"measurement": "GEMM", "dtype": "fp32", "causal": None, "rate": machine["fp32 GEMM"] / 1e9,
         "unit": "GFLOP/s", "% of GEMM": 100.0},
        {"measurement": "GEMM", "dtype": "bf16", "causal": None, "rate": machine["bf16 GEMM"] / 1e9,
         "unit": "GFLOP/s", "% of GEMM": 100.0},
        {"measurement": "copy bandwidth", "dtype": "fp32", "causal": None, "rate": machine["copy"] / 1e9,
         "unit": "GB/s", "% of GEMM": None},
    ]
    for (name, dtype, causal), rate in cores.items():
        gemm = machine[f"{dtype} GEMM"]
        result.rows.append({"measurement": f"attention {name}", "dtype": dtype, "causal": causal,
                            "rate": rate / 1e9, "unit": "GFLOP/s", "% of GEMM": 100.0 * rate / gemm})
    shapes_alone = cores[("q k^T + p v GEMMs alone", "fp32", False)] / machine["fp32 GEMM"]
    for causal in (False, True):
        share = cores[("ours", "fp32", causal)] / machine["fp32 GEMM"]
        kind = "causal" if causal else "non-causal"
        result.targets.append(Target(
            f"P3 attention core N={sizes.length} {kind}: share of fp32 GEMM rate", share, ">=", P3_GOAL,
            note=f"attention's own GEMM shapes alone reach {shapes_alone:.0%}"))
    return result
