"""Chunked attention (Llama 4): with Mask.chunks(C) & causal, query i sees only the keys of its own chunk
of C positions, from C·floor(i / C) up to itself, so the cost per query is at most C keys.

Shapes: B batch, H heads, L tokens, C chunk size, D head dim.
"""
from __future__ import annotations

import math

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic
from multihead.explain.topics.decoding import keep_rows

L, C = 10, 4


def chunk_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Each query attends, row by row, to keys C·floor(i / C) .. i alone: (B, H, L, D)."""
    rows = []
    for i in range(q.shape[-2]):
        lo = i // C * C
        weights = torch.softmax(q[..., i:i + 1, :] @ k[..., lo:i + 1, :].transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
        rows.append(weights @ v[..., lo:i + 1, :])
    return torch.cat(rows, dim=-2)


@topic("chunked-attention")
def chunked_attention(story: Story, say: Say) -> None:
    say.text("text.idea")
    mask = mh.Mask.chunks(C) & mh.Mask.causal()
    keep, _ = mask.materialize(1, 1, L, L)
    keep = keep.reshape(L, L)
    story.table([say("label.query"), say("label.keys")], [[i, row] for i, row in enumerate(keep_rows(keep, L, L))],
                title=say("label.mask", C=C, L=L))
    i, j = torch.arange(L).view(L, 1), torch.arange(L).view(1, L)
    say.check("check.own-chunk", torch.equal(keep, (j <= i) & (j >= i // C * C)), C=C)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, L, 8, generator=g, dtype=torch.float64) for _ in range(3))
    out, by_hand = mh.attention(q, k, v, mask), chunk_by_hand(q, k, v)
    say.check("check.by-hand", max_diff(out, by_hand) < 1e-12, diff_text(out, by_hand))
    say.heading("heading.decode")
    step = mh.attention(q[..., -1:, :], k, v, mh.Mask.chunks(C, "bottom_right") & mh.Mask.causal("bottom_right"))
    say.check("check.decode", max_diff(step, out[..., -1:, :]) < 1e-12, diff_text(step, out[..., -1:, :]),
              seen=(L - 1) % C + 1, p=L - 1)
    say.text("text.closing")
