"""Walkthrough steps 4-8: scores, scaling, the mask, softmax, and the weighted sum of the values.

Shapes: B batch, H heads, L tokens (queries and keys), D head dim.
"""
from __future__ import annotations

import functools
import math

import torch

from multihead.explain.say import walkthrough_say
from multihead.explain.story import Story
from multihead.explain.walkthrough.checks import check_close


def step_scores(story: Story, p) -> None:
    """scores (B, H, L, L) = q_heads @ k_headsᵀ."""
    q, k = p.t["q_heads"], p.t["k_heads"]
    story.code("scores = q @ k.transpose(-2, -1)  # (B,H,L,D) @ (B,H,D,L) -> (B,H,L,L)")
    scores = q @ k.transpose(-2, -1)  # (B, H, L, L)
    story.tensor("scores", scores, rows=p.setup.tokens)
    say = walkthrough_say(story, "scores")
    say.text("why")
    check_close(say, "check.dot", scores, torch.einsum("bhid,bhjd->bhij", q.double(), k.double()))
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
    say = walkthrough_say(story, "scale")
    say.text("why")
    rows, ok = dot_variances(D)
    rows = [list(row) for row in rows]  # the cached rows stay untouched
    story.table(["D", "var(q·k)", "var(q·k / √D)"], rows,
                title=say("label.random"))
    say.check("check.measured", ok)
    p.t["scaled"] = scaled


def step_mask(story: Story, p) -> None:
    """masked (B, H, L, L): -inf where a query may not look (the future, when causal)."""
    _, L, _, _ = p.dims
    scaled = p.t["scaled"]
    say = walkthrough_say(story, "mask")
    if not p.setup.causal:
        say.code("code.none")
        say.text("why.none")
        say.check("check.none", bool(torch.isfinite(scaled).all()))
        p.t["masked"] = scaled
        return
    say.code("code.causal")
    blocked = torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)  # (L, L)
    masked = scaled.masked_fill(blocked, float("-inf"))  # (B, H, L, L)
    story.tensor("blocked", blocked, rows=p.setup.tokens)
    story.tensor("masked", masked, rows=p.setup.tokens)
    say.text("why.causal")
    future = masked[..., blocked]
    kept = masked[..., ~blocked]
    say.check("check.future", bool(torch.isneginf(future).all()) and torch.equal(kept, scaled[..., ~blocked]),
              n=int(blocked.sum()))
    p.t["masked"] = masked
    p.t["blocked"] = blocked


def step_softmax(story: Story, p) -> None:
    """weights (B, H, L, L): softmax over the keys, each row a probability distribution."""
    masked = p.t["masked"]
    say = walkthrough_say(story, "softmax")
    say.code("code")
    weights = torch.softmax(masked, dim=-1)  # (B, H, L, L)
    story.tensor("weights", weights, rows=p.setup.tokens)
    if p.setup.heatmaps:
        story.figure("weights[0]", weights[0], tokens=p.setup.tokens)
    say.text("why")
    sums = weights.sum(-1)
    say.check("check.rows", bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-6)) and bool((weights >= 0).all()),
              f"max |row sum - 1| = {(sums - 1).abs().max().item():.1e}")
    if "blocked" in p.t:
        say.check("check.masked-zero", bool((weights[..., p.t["blocked"]] == 0).all()))
    p.t["weights"] = weights


def step_weighted_sum(story: Story, p) -> None:
    """ctx (B, H, L, D) = weights @ v_heads."""
    weights, v = p.t["weights"], p.t["v_heads"]
    story.code("ctx = weights @ v   # (B, H, L, L) @ (B, H, L, D) -> (B, H, L, D)")
    ctx = weights @ v  # (B, H, L, D)
    story.tensor("ctx", ctx, rows=p.setup.tokens)
    say = walkthrough_say(story, "weighted_sum")
    say.text("why")
    check_close(say, "check.ctx", ctx, torch.einsum("bhij,bhjd->bhid", weights.double(), v.double()))
    if p.setup.causal:
        check_close(say, "check.first-token", ctx[:, :, 0], v[:, :, 0])
    p.t["ctx"] = ctx
