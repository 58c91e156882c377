"""The softmax's axis: over the keys, so that each query's weights sum to 1; over the queries, the heads
or the batch (the checker's bug `softmax-wrong-axis`) the shapes stay right and the output goes wrong.

Shapes: B batch, H heads, Lq queries, Lk keys, D head dim; scores (B, H, Lq, Lk).
"""
from __future__ import annotations

import math

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

B, H, LQ, LK, D = 2, 2, 3, 4, 4
WRONG_AXES = {"queries": -2, "heads": 1, "batch": 0}   # the mistakes, by the axis they normalise


def _qkv(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for L in (LQ, LK, LK)]


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax(q kᵀ / √D, dim) @ v: (B, H, Lq, D); dim=-1 is the right axis, the keys."""
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(D), dim=dim) @ v


def sums_text(weights: torch.Tensor, story: Story) -> str:
    """The sums over the keys of batch 0, head 0's query rows: "1.000, 1.000, 1.000" (with "、" in Chinese)."""
    return story.pick(", ", "、").join(f"{s:.3f}" for s in weights.sum(-1)[0, 0].tolist())


@topic("softmax-axis")
def softmax_axis(story: Story, say: Say) -> None:
    q, k, v = _qkv()
    scores = q @ k.transpose(-2, -1) / math.sqrt(D)                # (B, H, Lq, Lk)
    say.text("text.one-row-per-query")
    say.code("code.right-axis")
    weights = scores.softmax(dim=-1)
    story.tensor(say("label.weights"), weights[0, 0])
    say.check("check.rows-sum-to-one", max_diff(weights.sum(-1), torch.ones(B, H, LQ)) < 1e-12,
              say("detail.sums", sums=sums_text(weights, story)))
    say.check("check.output-is-average", max_diff(attend(q, k, v), mh.attention(q, k, v)) < 1e-12,
              diff_text(attend(q, k, v), mh.attention(q, k, v)))

    say.heading("heading.wrong-axes")
    say.code("code.wrong-axes")
    wrong = {name: scores.softmax(dim=axis) for name, axis in WRONG_AXES.items()}
    say.check("check.same-shape-no-error", all(w.shape == weights.shape for w in wrong.values()))
    say.check("check.rows-no-longer-sum", all(max_diff(w.sum(-1), torch.ones(B, H, LQ)) > 0.1 for w in wrong.values()),
              say("detail.query-sums", sums=sums_text(wrong["queries"], story)))
    columns = wrong["queries"].sum(-2)                             # (B, H, Lk): over the queries instead
    say.check("check.queries-columns-sum", max_diff(columns, torch.ones(B, H, LK)) < 1e-12)

    other_head, other_batch = k.clone(), k.clone()
    other_head[:, 1] = torch.randn(B, LK, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    other_batch[1] = torch.randn(H, LK, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    heads_leak = max_diff(attend(q, other_head, v, 1)[:, 0], attend(q, k, v, 1)[:, 0])
    batch_leak = max_diff(attend(q, other_batch, v, 0)[0], attend(q, k, v, 0)[0])
    right_head = max_diff(attend(q, other_head, v)[:, 0], attend(q, k, v)[:, 0])
    right_batch = max_diff(attend(q, other_batch, v)[0], attend(q, k, v)[0])
    say.check("check.heads-leak", heads_leak > 1e-3 and right_head < 1e-12, say("detail.moved", diff=heads_leak))
    say.check("check.batch-leaks", batch_leak > 1e-3 and right_batch < 1e-12, say("detail.moved", diff=batch_leak))

    say.heading("heading.other-layouts")
    seq_first = scores.permute(2, 3, 0, 1)                         # (Lq, Lk, B, H), document 003's layout
    say.code("code.other-layouts")
    say.check("check.labml-dim-1", max_diff(seq_first.softmax(dim=1).permute(2, 3, 0, 1), weights) < 1e-12)
    say.text("text.checker")
