"""Differential attention (DiffLlama): the heads work in pairs, and each pair subtracts its second
softmax map, times a learned λ, from the first, so the weight both maps give to the same irrelevant
keys cancels.

Shapes: B batch, H heads (H/2 pairs), L tokens, D head dim.
"""
from __future__ import annotations

import math

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

E, H, L = 16, 2, 6


def pair_maps(mod: mh.DifferentialAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two softmax maps (L, L) of the only head pair, written out: head 0 and head H/2 = 1."""
    D = mod.head_dim
    q = mod.q_proj(x).view(L, H, D).transpose(0, 1)  # (H, L, D)
    k = mod.k_proj(x).view(L, H, D).transpose(0, 1)
    blocked = torch.ones(L, L, dtype=torch.bool).triu(1)
    maps = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(blocked, float("-inf")), -1)
    return maps[0], maps[1]


@topic("differential-attention")
def differential_attention(story: Story, say: Say) -> None:
    torch.manual_seed(0)
    mod = mh.DifferentialAttention(E, H, causal=True, lambda_init=0.8, dtype=torch.float64)
    x = torch.randn(L, E, dtype=torch.float64)
    say.text("text.idea")
    say.code("code.formula")
    with torch.no_grad():
        first, second = pair_maps(mod, x)
        lam = mod.lambda_full(torch.float64)
        difference = first - lam * second  # (L, L)
        v = mod.v_proj(x).view(L, H, -1)  # (L, Hkv, D): the two value halves, side by side below
        wide = torch.cat([v[:, 0], v[:, 1]], dim=-1)  # (L, 2D)
        pair = (1 - mod.lambda_init) * torch.nn.functional.rms_norm(difference @ wide, (wide.shape[-1],),
                                                                    eps=mod.pair_norm.eps)
        by_hand = mod.out_proj(pair)
        out = mod(x[None])[0]
    say.check("check.by-hand", max_diff(out, by_hand) < 1e-12, diff_text(out, by_hand))
    rows = difference.sum(-1)
    say.check("check.row-sums", max_diff(rows, (1 - lam).expand(L)) < 1e-12, f"1 - λ = {1 - lam:.4f}")
    story.table([say("label.query")] + [str(j) for j in range(L)],
                [[i] + [f"{w:+.2f}" for w in difference[i]] for i in range(L)], title=say("label.map", lam=f"{lam:.3f}"))
    say.heading("heading.cancel")
    common = torch.full((L,), 1.0 / L, dtype=torch.float64)  # a map both heads share: the same weight everywhere
    focused = torch.zeros(L, dtype=torch.float64)
    focused[2] = 1.0
    shared = 0.5 * focused + 0.5 * common  # first map: half on key 2, half spread out
    cancelled = shared - 0.5 * common  # λ = 0.5 against a second map that is only the spread
    others = torch.cat([cancelled[:2], cancelled[3:]])
    say.check("check.cancel", float(others.abs().max()) < 1e-12 and float(shared[2]) < 0.6,
              say("detail.share", before=float(shared[2]), after=float(cancelled[2] / cancelled.sum())))
    say.text("text.closing")
