"""Walkthrough steps 4-8: scores, scaling, the mask, softmax, and the weighted sum of the values.

Shapes: B batch, H heads, L tokens (queries and keys), D head dim.
"""
from __future__ import annotations

import functools
import math

import torch

from multihead.explain.story import Story
from multihead.explain.walkthrough.checks import check_close


def step_scores(story: Story, p) -> None:
    """scores (B, H, L, L) = q_heads @ k_headsᵀ."""
    q, k = p.t["q_heads"], p.t["k_heads"]
    story.code("scores = q @ k.transpose(-2, -1)  # (B,H,L,D) @ (B,H,D,L) -> (B,H,L,L)")
    scores = q @ k.transpose(-2, -1)  # (B, H, L, L)
    story.tensor("scores", scores, rows=p.setup.tokens)
    story.text(
        "Why: entry (i, j) is the dot product of query i with key j, how well token j matches what "
        "token i looks for, computed for every head at once.",
        "为什么：第 (i, j) 个元素是查询 i 与键 j 的点积，表示词元 j 与词元 i 要找的内容有多匹配；"
        "所有头一次算完。",
    )
    check_close(
        story,
        "scores[b, h, i, j] is the dot product of q[b, h, i] and k[b, h, j] for every entry.",
        "对每个元素，scores[b, h, i, j] 都等于 q[b, h, i] 与 k[b, h, j] 的点积。",
        scores, torch.einsum("bhid,bhjd->bhij", q.double(), k.double()),
    )
    p.t["scores"] = scores


@functools.cache
def dot_variances(D: int) -> tuple[list[list], bool]:
    """Measured on 20000 random unit-variance pairs, for head dims D and 64: rows [d, var(q·k),
    var(q·k / √d)] and whether var(q·k) ≈ d and var(q·k / √d) ≈ 1 (within 10%). Seeded, so the
    same D always gives the same rows; cached, since every layer of a model asks again."""
    gen = torch.Generator().manual_seed(0)
    rows, ok = [], True
    for d in sorted({D, 64}):
        qs, ks = torch.randn(20000, d, generator=gen), torch.randn(20000, d, generator=gen)
        dots = (qs * ks).sum(-1)
        raw, scaled_var = dots.var().item(), (dots / math.sqrt(d)).var().item()
        ok &= abs(scaled_var - 1.0) < 0.1 and abs(raw / d - 1.0) < 0.1
        rows.append([d, f"{raw:.2f}", f"{scaled_var:.2f}"])
    return rows, ok


def step_scale(story: Story, p) -> None:
    """scaled (B, H, L, L) = scores / sqrt(D), and why, measured on random vectors."""
    _, _, _, D = p.dims
    scores = p.t["scores"]
    story.code(f"scaled = scores / math.sqrt(D)   # D = head_dim = {D}")
    scaled = scores / math.sqrt(D)  # (B, H, L, L)
    story.tensor("scaled", scaled, rows=p.setup.tokens)
    story.text(
        "Why: a dot product of D random numbers has variance about D, so large heads would push softmax "
        "into one-hot weights with vanishing gradients; dividing by √D brings the variance back to about 1.",
        "为什么：D 个随机数的点积方差约为 D，头维度一大，softmax 就会饱和成近乎 one-hot 的权重，"
        "梯度几乎消失；除以 √D（缩放点积）把方差拉回到 1 左右。",
    )
    rows, ok = dot_variances(D)
    rows = [list(row) for row in rows]  # the cached rows stay untouched
    story.table(["D", "var(q·k)", "var(q·k / √D)"], rows,
                title=story.pick("random q, k with unit-variance entries", "元素方差为 1 的随机 q、k"))
    story.check(
        "Measured on 20000 random unit-variance pairs: var(q·k) ≈ D, and var(q·k / √D) ≈ 1.",
        "在 20000 对方差为 1 的随机向量上实测：var(q·k) ≈ D，而 var(q·k / √D) ≈ 1。",
        ok,
    )
    p.t["scaled"] = scaled


def step_mask(story: Story, p) -> None:
    """masked (B, H, L, L): -inf where a query may not look (the future, when causal)."""
    _, L, _, _ = p.dims
    scaled = p.t["scaled"]
    if not p.setup.causal:
        story.code(story.pick("masked = scaled   # no mask: every token may look at every token",
                              "masked = scaled   # 不加掩码：每个词元都能看到所有词元"))
        story.text(
            "Why: this model reads the whole sentence in both directions, and one sentence has no padding, "
            "so nothing is hidden.",
            "为什么：这个模型双向阅读整句话，而且只有一句话、没有填充，所以不需要掩码遮住任何位置。",
        )
        story.check(
            "No score is -inf: every query keeps every key.",
            "没有任何分数是 -inf：每个查询都能看到所有的键。",
            bool(torch.isfinite(scaled).all()),
        )
        p.t["masked"] = scaled
        return
    story.code(story.pick(
        "ones = torch.ones(L, L, dtype=torch.bool)\n"
        "blocked = torch.triu(ones, diagonal=1)   # True above the diagonal: the future\n"
        "masked = scaled.masked_fill(blocked, float(\"-inf\"))\n"
        "# in multihead: mh.attention(q, k, v, mask=mh.Mask.causal())",
        "ones = torch.ones(L, L, dtype=torch.bool)\n"
        "blocked = torch.triu(ones, diagonal=1)   # 对角线以上为 True：未来的位置\n"
        "# 下表把 True 写成“是”，False 写成“否”\n"
        "masked = scaled.masked_fill(blocked, float(\"-inf\"))\n"
        "# multihead 里这样写：mh.attention(q, k, v, mask=mh.Mask.causal())",
    ))
    blocked = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)  # (L, L)
    masked = scaled.masked_fill(blocked, float("-inf"))  # (B, H, L, L)
    story.tensor("blocked", blocked, rows=p.setup.tokens)
    story.tensor("masked", masked, rows=p.setup.tokens)
    story.text(
        "Why: a causal model must not see later tokens, so their scores become -inf, and softmax turns "
        "-inf into a weight of exactly 0.",
        "为什么：因果模型不能看到后面的词元，所以把它们的分数填成 -inf，softmax 会把 -inf 变成恰好为 0 的权重。",
    )
    future = masked[..., blocked]
    kept = masked[..., ~blocked]
    story.check(
        f"All {int(blocked.sum())} future positions per head are -inf; the rest are the scaled scores unchanged.",
        f"每个头中 {int(blocked.sum())} 个“未来”位置都是 -inf，其余位置仍是原来的缩放分数。",
        bool(torch.isneginf(future).all()) and torch.equal(kept, scaled[..., ~blocked]),
    )
    p.t["masked"] = masked
    p.t["blocked"] = blocked


def step_softmax(story: Story, p) -> None:
    """weights (B, H, L, L): softmax over the keys, each row a probability distribution."""
    masked = p.t["masked"]
    story.code(story.pick("weights = torch.softmax(masked, dim=-1)   # over the keys: each row sums to 1",
                          "weights = torch.softmax(masked, dim=-1)   # 对键做 softmax：每行之和为 1"))
    weights = torch.softmax(masked, dim=-1)  # (B, H, L, L)
    story.tensor("weights", weights, rows=p.setup.tokens)
    if p.setup.heatmaps:
        story.figure("weights[0]", weights[0], tokens=p.setup.tokens)
    story.text(
        "Why: softmax turns each row of scores into non-negative weights that sum to 1, the attention "
        "weights: how much each query takes from each key.",
        "为什么：softmax 把每一行分数变成非负、且和为 1 的权重，也就是注意力权重：每个查询从每个键取多少。",
    )
    sums = weights.sum(-1)
    story.check(
        "Every row of weights sums to 1 and no weight is negative.",
        "注意力权重的每一行之和都是 1，且没有负数。",
        bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-6)) and bool((weights >= 0).all()),
        f"max |row sum - 1| = {(sums - 1).abs().max().item():.1e}",
    )
    if "blocked" in p.t:
        story.check(
            "Masked (future) positions get a weight of exactly 0.",
            "被掩码遮住的（未来的）位置，权重恰好为 0。",
            bool((weights[..., p.t["blocked"]] == 0).all()),
        )
    p.t["weights"] = weights


def step_weighted_sum(story: Story, p) -> None:
    """ctx (B, H, L, D) = weights @ v_heads."""
    weights, v = p.t["weights"], p.t["v_heads"]
    story.code("ctx = weights @ v   # (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)")
    ctx = weights @ v  # (B, H, L, D)
    story.tensor("ctx", ctx, rows=p.setup.tokens)
    story.text(
        "Why: each output row is an average of the value vectors, weighted by how much that query "
        "attends to each key.",
        "为什么：每一行输出都是各个值向量（V）的加权平均，权重就是这个查询对每个键的注意力。",
    )
    check_close(
        story,
        "ctx[b, h, i] = Σ_j weights[b, h, i, j] · v[b, h, j] for every query i.",
        "对每个查询 i：ctx[b, h, i] = Σ_j weights[b, h, i, j] · v[b, h, j]。",
        ctx, torch.einsum("bhij,bhjd->bhid", weights.double(), v.double()),
    )
    if p.setup.causal:
        check_close(
            story,
            "The first token can only see itself, so its output is exactly its own value vector.",
            "第一个词元只能看到它自己，所以它的输出恰好就是它自己的值向量。",
            ctx[:, :, 0], v[:, :, 0],
        )
    p.t["ctx"] = ctx
