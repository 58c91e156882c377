"""Padded: the length-aware path against dense-masked SDPA on a batch of very different lengths.

8 sequences, valid lengths evenly spaced from N/8 to N (N=4096), H=8, D=64, fp32, forward (the
targets), then forward+backward of the dense path and ours (gradients of q, k, v).
"keys" pads the keys only (d2l's valid_lens); "both" also pads the queries (query_lens: queries past
their length are padding with zero output). The dense baseline is SDPA with the bool mask built
beforehand; `ours[sdpa]` is the same dense path through multihead (mask built per call, padded
query rows zeroed). The ideal ratio is the dense grid over the valid one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio

TARGETS = {"keys": 1.6, "both": 2.3}


@dataclass(frozen=True)
class Sizes:
    length: int
    batch: int = 8
    heads: int = 8
    head_dim: int = 64

    @classmethod
    def full(cls) -> Sizes:
        return cls(4096)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(1024)


def valid_lengths(sizes: Sizes) -> torch.Tensor:
    """(B,) lengths evenly spaced from N/B to N."""
    n, b = sizes.length, sizes.batch
    return torch.tensor([n * (i + 1) // b for i in range(b)])


def _training_step(leaves: list[torch.Tensor], mask: mh.Mask, backend: str):
    """Forward, sum, and the gradients of q, k, v."""
    def step():
        out = mh.attention(*leaves, mask, backend=backend)
        torch.autograd.grad(out.sum(), leaves)
    return step


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    B, H, N, D = sizes.batch, sizes.heads, sizes.length, sizes.head_dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))  # (B, H, N, D)
    lens = valid_lengths(sizes)
    masks = {"keys": mh.Mask.lengths(lens), "both": mh.Mask.lengths(lens, query_lens=lens)}
    result = SuiteResult(
        "padded",
        f"Padded: B={B}, N={N}, H={H}, D={D}, lengths {lens.tolist()}, fp32 forward",
        ["padding", "pass", "implementation", "ms", "dense / this", "ideal", "max |diff| vs dense",
         "backend"],
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with ctx.bars.task("padded", total=2 * ctx.rounds * len(masks)) as steps:
        for label, mask in masks.items():
            steps.describe(f"padded {label}")
            keep = mask.materialize(B, H, N, N)[0]  # (B, 1, 1 or N, N) bool
            fns = {
                "dense-masked SDPA": lambda keep=keep: F.scaled_dot_product_attention(q, k, v, keep),
                "ours[sdpa]": lambda mask=mask: mh.attention(q, k, v, mask, backend="sdpa"),
                "ours": lambda mask=mask: mh.attention(q, k, v, mask),
            }
            with torch.no_grad():
                t = compare(fns, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s,
                            on_round=steps.advance)
                diff = (fns["ours"]() - fns["ours[sdpa]"]()).abs().max().item()
            chosen = mh.dispatch(q, k, v, mask).backend
            valid = lens.sum() * N if label == "keys" else (lens * lens).sum()
            ideal = B * N * N / float(valid)
            base = t["dense-masked SDPA"]
            for name, timing in t.items():
                result.rows.append({
                    "padding": label, "pass": "forward", "implementation": name,
                    "ms": timing.median_s * 1e3,
                    "dense / this": ratio(base, timing), "ideal": ideal if name == "ours" else None,
                    "max |diff| vs dense": diff if name == "ours" else None,
                    "backend": chosen if name == "ours" else ("sdpa" if name == "ours[sdpa]" else ""),
                })
            result.targets.append(Target(f"P4 {label}: dense-masked SDPA / ours", ratio(base, t["ours"]),
                                         ">=", TARGETS[label], note=f"ideal {ideal:.2f}, backend {chosen}"))
            steps.describe(f"padded {label} fwd+bwd")
            trained = compare({name: _training_step(leaves, mask, backend)
                               for name, backend in (("ours[sdpa]", "sdpa"), ("ours", "auto"))},
                              rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s / 2,
                              on_round=steps.advance)
            for name, timing in trained.items():
                result.rows.append({
                    "padding": label, "pass": "fwd+bwd", "implementation": name,
                    "ms": timing.median_s * 1e3,
                    "dense / this": ratio(trained["ours[sdpa]"], timing), "ideal": None,
                    "max |diff| vs dense": None, "backend": chosen if name == "ours" else "sdpa",
                })
    return result
