"""Padded: the length-aware path against dense-masked SDPA on a batch of very different lengths.

8 sequences, valid lengths evenly spaced from N/8 to N (N=4096), H=8, D=64, fp32, forward (the
targets), then forward+backward of the dense path and ours (gradients of q, k, v).
"keys" pads the keys only (d2l's valid_lens); "both" also pads the queries (query_lens: queries past
their length are padding with zero output). Every ratio is taken against the strongest dense
baseline, the fastest of the plain SDPA calls that give the same output with masks built beforehand:
a (B, 1, 1, N) key mask (then, for "both", the padded query rows set to zero afterwards), or for
"both" the full (B, 1, N, N) mask. `ours[sdpa]` is the dense path through multihead (mask built per
call, padded query rows zeroed). The ideal ratio is the dense grid over the valid one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio, ratio_range

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


def dense_baselines(q, k, v, lens: torch.Tensor, pad_queries: bool) -> dict:
    """{name: call} for plain SDPA on the padded batch, masks built here. q, k, v (B, H, N, D)."""
    B, _, N, _ = q.shape
    valid = torch.arange(N, device=q.device) < lens.to(q.device)[:, None]  # (B, N) True = a real token
    key_keep = valid[:, None, None, :]  # (B, 1, 1, N)
    if not pad_queries:
        return {"dense SDPA, key mask": lambda: F.scaled_dot_product_attention(q, k, v, key_keep)}
    query_keep = valid[:, None, :, None]  # (B, 1, N, 1)
    full_keep = key_keep & query_keep  # (B, 1, N, N)
    dead_rows_open = full_keep | ~query_keep  # padded query rows attend everything, zeroed after
    return {
        "dense SDPA, key mask + zeroed rows": lambda: F.scaled_dot_product_attention(
            q, k, v, key_keep).masked_fill(~query_keep, 0.0),
        "dense SDPA, (B, 1, N, N) mask": lambda: F.scaled_dot_product_attention(
            q, k, v, dead_rows_open).masked_fill(~query_keep, 0.0),
    }


def _training_step(forward, leaves: list[torch.Tensor]):
    """Run `forward()`, sum, and take the gradients of the q, k, v `leaves` it reads."""
    def step():
        torch.autograd.grad(forward().sum(), leaves)
    return step


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    B, H, N, D = sizes.batch, sizes.heads, sizes.length, sizes.head_dim
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g) for _ in range(3))  # (B, H, N, D)
    lens = valid_lengths(sizes)
    masks = {"keys": mh.Mask.lengths(lens), "both": mh.Mask.lengths(lens, query_lens=lens)}
    result = SuiteResult(
        "padded",
        f"Padded: B={B}, N={N}, H={H}, D={D}, lengths {lens.tolist()}, fp32",
        ["padding", "pass", "implementation", "ms", "strongest dense / this", "ideal",
         "max |diff| vs dense", "backend"],
    )
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    with ctx.bars.task("padded", total=2 * ctx.rounds * len(masks)) as steps:
        for label, mask in masks.items():
            steps.describe(f"padded {label}")
            dense = dense_baselines(q, k, v, lens, pad_queries=label == "both")
            fns = {**dense,
                   "ours[sdpa]": lambda mask=mask: mh.attention(q, k, v, mask, backend="sdpa"),
                   "ours": lambda mask=mask: mh.attention(q, k, v, mask)}
            with torch.no_grad():
                t = compare(fns, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s,
                            on_round=steps.advance)
                reference = fns["ours[sdpa]"]()
                diffs = {name: (fns[name]() - reference).abs().max().item() for name in (*dense, "ours")}
            strongest = min(dense, key=lambda name: t[name].median_s)
            chosen = mh.dispatch(q, k, v, mask).backend
            valid = lens.sum() * N if label == "keys" else (lens * lens).sum()
            ideal = B * N * N / float(valid)
            base = t[strongest]
            for name, timing in t.items():
                result.rows.append({
                    "padding": label, "pass": "forward", "implementation": name,
                    "ms": timing.median_s * 1e3,
                    "strongest dense / this": ratio(base, timing), "ideal": ideal if name == "ours" else None,
                    "max |diff| vs dense": diffs.get(name),
                    "backend": _backend(name, chosen),
                })
            lo, hi = ratio_range(base, t["ours"])
            result.targets.append(Target(f"P4 {label}: strongest dense SDPA / ours", ratio(base, t["ours"]),
                                         ">=", TARGETS[label],
                                         note=f"strongest dense: {strongest}; ideal {ideal:.2f}, backend {chosen}; "
                                              f"per-round ratios {lo:.2f} to {hi:.2f}"))
            steps.describe(f"padded {label} fwd+bwd")
            dense_forward = dense_baselines(*leaves, lens, pad_queries=label == "both")[strongest]
            trained = compare({
                strongest: _training_step(dense_forward, leaves),
                "ours[sdpa]": _training_step(lambda mask=mask: mh.attention(*leaves, mask, backend="sdpa"), leaves),
                "ours": _training_step(lambda mask=mask: mh.attention(*leaves, mask), leaves),
            }, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s / 2, on_round=steps.advance)
            for name, timing in trained.items():
                result.rows.append({
                    "padding": label, "pass": "fwd+bwd", "implementation": name,
                    "ms": timing.median_s * 1e3,
                    "strongest dense / this": ratio(trained[strongest], timing), "ideal": None,
                    "max |diff| vs dense": None, "backend": _backend(name, chosen),
                })
    return result


def _backend(name: str, chosen: str) -> str:
    return {"ours": chosen, "ours[sdpa]": "sdpa"}.get(name, "")
