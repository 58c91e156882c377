"""RoPE: each pair of features of a query or key turns by an angle proportional to its position. Turning
keeps lengths, and a turned query and key meet at the angle between their positions, so their score
depends only on the relative position j - i. The half-split and interleaved layouts are one rotation
on differently ordered features.

Shapes: B batch, H heads, L positions, D head dim (D / 2 pairs of features).
"""
from __future__ import annotations

import math

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

ANGLE_TOL = 1e-5   # RoPE computes its angles in float32 (as HF does): ~1e-7 relative, times the position
SHIFT_TOL = 1e-4   # scores of positions shifted by 1000: their float32 angles are ~1000 times coarser


def pairs(x: torch.Tensor, interleaved: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The two coordinates (a, b) of every pair of features, each (..., D/2): features (j, j + D/2)
    in the half-split layout, (2j, 2j + 1) interleaved."""
    if interleaved:
        return x[..., 0::2], x[..., 1::2]
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def wrap(angle: torch.Tensor) -> torch.Tensor:
    """Angles folded into (-π, π]."""
    return torch.remainder(angle + math.pi, 2 * math.pi) - math.pi


def turned_angles(x: torch.Tensor, turned: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """By how much RoPE turned each pair of x (..., D) into `turned`: (..., D/2), in (-π, π]."""
    (a, b), (a2, b2) = pairs(x, interleaved), pairs(turned, interleaved)
    return wrap(torch.atan2(b2, a2) - torch.atan2(b, a))


def expected_angles(positions: torch.Tensor, D: int, base: float = 10000.0) -> torch.Tensor:
    """position * base ** (-2j / D) for every position (L,) and pair j: (L, D/2), in (-π, π]."""
    frequencies = base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)   # (D/2,) pair j turns this fast
    return wrap(positions.double()[:, None] * frequencies)


def scores(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q · k for every pair of positions: (..., Lq, D) x (..., Lk, D) -> (..., Lq, Lk), unscaled."""
    return q @ k.transpose(-2, -1)


def roped_scores(rope: mh.RoPE, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Scores (B, H, L, L) of q, k (B, H, L, D) after RoPE turns both to `positions` (L,)."""
    return scores(*rope(q, k, positions))


def relative_scores(rope: mh.RoPE, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, H, L, L): score[i, j] = q_i · (k_j turned by j - i), with q_i not turned at all."""
    L = q.shape[-2]
    rows = []
    for i in range(L):
        shifted = rope(q, k, torch.arange(L) - i)[1]   # every key turned by its offset from query i
        rows.append(scores(q[..., i:i + 1, :], shifted))
    return torch.cat(rows, dim=-2)


def is_toeplitz(m: torch.Tensor, tol: float) -> bool:
    """True when m (L, L) is constant along each diagonal: m[i, j] depends only on j - i."""
    return bool((m[1:, 1:] - m[:-1, :-1]).abs().max() <= tol)


def interleave_order(D: int) -> list[int]:
    """The feature order [0, D/2, 1, D/2 + 1, ...]: x[..., order] puts each half-split pair (j, j + D/2)
    at the interleaved places (2j, 2j + 1)."""
    return [f for j in range(D // 2) for f in (j, j + D // 2)]


def partners(rope: mh.RoPE) -> list[int]:
    """For each feature f, the one it turns with, found by turning the unit vector e_f to position 1
    and seeing which other feature receives something."""
    D = rope.head_dim
    unit = torch.eye(D, dtype=torch.float64).view(1, 1, D, D)             # row f: e_f
    turned, _ = rope(unit, unit, torch.ones(D, dtype=torch.long))
    moved = turned[0, 0].abs() * (1 - torch.eye(D, dtype=torch.float64))  # what went to other features
    return moved.argmax(-1).tolist()


@topic("rope")
def rope_topic(story: Story, say: Say) -> None:
    g = torch.Generator().manual_seed(0)
    say.text("text.idea")
    say.code("code.rope")
    tell_rotation(story, say, g)
    tell_relative(story, say, g)
    tell_layouts(story, say, g)
    say.text("text.closing")


def tell_rotation(story: Story, say: Say, g: torch.Generator, D: int = 8) -> None:
    """The angle each pair turned by, measured, against position * frequency; lengths kept."""
    say.heading("heading.rotation")
    positions = torch.tensor([0, 1, 2, 3, 100])
    x = torch.randn(1, 1, len(positions), D, generator=g, dtype=torch.float64)   # (B, H, L, D)
    turned, _ = mh.RoPE(D)(x, x, positions)
    measured = turned_angles(x, turned)[0, 0]                                    # (L, D/2)
    story.table([say("label.position"), *(say("label.pair", j=j, partner=j + D // 2) for j in range(D // 2))],
                [[p, *(f"{a:+.4f}" for a in row)] for p, row in zip(positions.tolist(), measured.tolist())],
                title=say("label.angles", D=D))
    gap = wrap(measured - expected_angles(positions, D))
    say.check("check.angles", max_diff(gap, torch.zeros_like(gap)) < ANGLE_TOL, diff_text(gap, torch.zeros_like(gap)))
    lengths = max_diff(turned.norm(dim=-1), x.norm(dim=-1))
    pair_lengths = max_diff(torch.hypot(*pairs(turned, False)), torch.hypot(*pairs(x, False)))
    say.check("check.norms", max(lengths, pair_lengths) < 1e-6, f"max |diff| = {max(lengths, pair_lengths):.1e}")


def tell_relative(story: Story, say: Say, g: torch.Generator, D: int = 8, L: int = 6) -> None:
    """Scores of turned queries and keys: constant along diagonals, unchanged by a shift, unlike
    added absolute positions."""
    say.heading("heading.relative")
    say.code("code.relative")
    rope = mh.RoPE(D)
    same_q = torch.randn(D, generator=g, dtype=torch.float64).expand(1, 1, L, D)   # one query vector everywhere
    same_k = torch.randn(D, generator=g, dtype=torch.float64).expand(1, 1, L, D)   # one key vector everywhere
    diagonals = roped_scores(rope, same_q, same_k, torch.arange(L))[0, 0]
    story.tensor(say("label.same-vectors", L=L), diagonals)
    say.check("check.diagonals", is_toeplitz(diagonals, ANGLE_TOL) and float(diagonals.max() - diagonals.min()) > 0.1)
    q, k = (torch.randn(1, 2, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    start = roped_scores(rope, q, k, torch.arange(L))
    offset = 1000
    shifted = roped_scores(rope, q, k, torch.arange(L) + offset)
    say.check("check.shift", max_diff(shifted, start) < SHIFT_TOL, diff_text(shifted, start), offset=offset)
    relative = relative_scores(rope, q, k)
    say.check("check.only-relative", max_diff(relative, start) < ANGLE_TOL, diff_text(relative, start))
    table = torch.randn(L + offset, D, generator=g, dtype=torch.float64)     # learned absolute positions, say
    added = [scores(q + table[p], k + table[p]) for p in (torch.arange(L), torch.arange(L) + offset)]
    say.check("check.absolute-moves", max_diff(*added) > 0.1, diff_text(*added))


def tell_layouts(story: Story, say: Say, g: torch.Generator, D: int = 8, L: int = 6) -> None:
    """Which features pair up in each layout, measured; one layout is the other on reordered features."""
    say.heading("heading.layouts")
    half, interleaved = mh.RoPE(D), mh.RoPE(D, interleaved=True)
    found = {"half": partners(half), "interleaved": partners(interleaved)}
    story.table([say("label.feature"), *map(str, range(D))],
                [[say(f"label.partner-{name}"), *found[name]] for name in ("half", "interleaved")],
                title=say("label.partners"))
    say.check("check.partners", found["half"] == [(f + D // 2) % D for f in range(D)]
              and found["interleaved"] == [f ^ 1 for f in range(D)])
    order = interleave_order(D)
    say.code("code.layouts", order=order)
    q, k = (torch.randn(1, 2, L, D, generator=g, dtype=torch.float64) for _ in range(2))
    positions = torch.arange(L)
    half_q, _ = half(q, k, positions)
    inter_q, _ = interleaved(q[..., order], k[..., order], positions)
    reordered_q = half_q[..., order]
    say.check("check.same-rotation", max_diff(inter_q, reordered_q) < 1e-12, diff_text(inter_q, reordered_q))
    start = roped_scores(half, q, k, positions)
    reordered = roped_scores(interleaved, q[..., order], k[..., order], positions)
    say.check("check.same-scores", max_diff(reordered, start) < 1e-12, diff_text(reordered, start))
    unpermuted = roped_scores(interleaved, q, k, positions)
    say.check("check.layout-matters", max_diff(unpermuted, start) > 0.1, diff_text(unpermuted, start))
