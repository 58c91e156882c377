"""Sliding windows and attention sinks. A window (Mask.window & causal) lets each query see only the last
W keys, and the banded backend computes only those scores, so the work grows with Lq * W, not Lq * Lk.
A sink is one extra logit per head in each row's softmax denominator that carries no value: the row's
weights on the keys then sum to less than 1, and the rest of its weight goes nowhere.

Shapes: B batch, H heads, Lq queries, Lk keys, W window, D head dim.
"""
from __future__ import annotations

import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic
from multihead.explain.topics.decoding import keep_rows

NO_SINK = -1e4   # exp(-1e4) is exactly 0 in float64: a sink this low takes no weight at all


def window_keep(L: int, W: int) -> torch.Tensor:
    """The keep mask (L, L) of Mask.window(W) & Mask.causal(): True = query i may attend to key j."""
    keep, _ = (mh.Mask.window(W) & mh.Mask.causal()).materialize(1, 1, L, L)
    return keep.reshape(L, L)


def last_keys_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, W: int) -> torch.Tensor:
    """Each query i attends to keys max(0, i - W + 1) .. i alone, row by row, written out by hand:
    q, k, v (B, H, L, D) -> (B, H, L, D)."""
    rows = []
    for i in range(q.shape[-2]):
        lo = max(0, i - W + 1)
        weights = torch.softmax(q[..., i:i + 1, :] @ k[..., lo:i + 1, :].transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
        rows.append(weights @ v[..., lo:i + 1, :])
    return torch.cat(rows, dim=-2)


class ScoreCount(TorchDispatchMode):
    """While active, counts the scaled-dot-product kernel calls and the score entries they compute,
    B * H * Lq * Lk per call (q (B, H, Lq, D), k (B, Hkv, Lk, D))."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.entries = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "scaled_dot_product" in str(func):
            q, k = args[0], args[1]
            self.calls += 1
            self.entries += q.shape[0] * q.shape[1] * q.shape[-2] * k.shape[-2]
        return func(*args, **(kwargs or {}))


def counted_attention(q, k, v, mask, backend: str = "auto") -> tuple[torch.Tensor, ScoreCount]:
    """mh.attention(q, k, v, mask, backend=backend) and the score entries its kernels computed."""
    with ScoreCount() as count:
        out = mh.attention(q, k, v, mask, backend=backend)
    return out, count


def sink_weights(q: torch.Tensor, k: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """The weights (B, H, Lq, Lk) mh.attention gives each key, read back by attending to one-hot values
    (value j = the j-th unit vector, so the output row is the weight row itself)."""
    B, H, Lk = q.shape[0], q.shape[1], k.shape[-2]
    one_hot = torch.eye(Lk, dtype=q.dtype).expand(B, H, Lk, Lk)
    return mh.attention(q, k, one_hot, sinks=sinks)


def softmax_with_sink(q: torch.Tensor, k: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """By hand: softmax over [scores, sink] for every row, (B, H, Lq, Lk + 1); the last column is the sink's."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])                   # (B, H, Lq, Lk)
    sink = sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)                # (B, H, Lq, 1)
    return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)


def sink_as_zero_value_key(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """Attention over one more key whose value is 0 and whose score is the head's sink (a zero key
    scores 0, and an additive mask adds the sink to that column): (B, H, Lq, D)."""
    B, H, Lq, _ = q.shape
    zero = torch.zeros_like(k[..., :1, :])
    bias = torch.zeros(1, H, 1, k.shape[-2] + 1, dtype=q.dtype)
    bias[..., -1] = sinks.view(H, 1)
    return mh.attention(q, torch.cat([k, zero], -2), torch.cat([v, zero], -2), mh.Mask.additive(bias))


@topic("window-and-sinks")
def window_and_sinks(story: Story, say: Say) -> None:
    g = torch.Generator().manual_seed(0)
    say.text("text.window")
    tell_window(story, say, g)
    tell_banded(story, say, g)
    tell_sinks(story, say, g)
    say.text("text.closing")


def tell_window(story: Story, say: Say, g: torch.Generator) -> None:
    """The window mask, and attention under it against the last W keys taken by hand."""
    say.heading("heading.window")
    L, W = 8, 3
    keep = window_keep(L, W)
    story.table([say("label.query"), say("label.keys")], [[i, row] for i, row in enumerate(keep_rows(keep, L, L))],
                title=say("label.mask", W=W, L=L))
    i, j = torch.arange(L).view(L, 1), torch.arange(L).view(1, L)
    say.check("check.last-w-keys", torch.equal(keep, (j <= i) & (j > i - W))
              and keep.sum(-1).tolist() == [min(n + 1, W) for n in range(L)], W=W)
    q, k, v = (torch.randn(1, 2, L, 16, generator=g, dtype=torch.float64) for _ in range(3))   # (B, H, L, D)
    windowed = mh.attention(q, k, v, mh.Mask.window(W) & mh.Mask.causal())
    by_hand = last_keys_attention(q, k, v, W)
    say.check("check.window-equals-slices", max_diff(windowed, by_hand) < 1e-12, diff_text(windowed, by_hand), W=W)


def tell_banded(story: Story, say: Say, g: torch.Generator) -> None:
    """What mh.dispatch says for a long windowed call, and the scores each backend computes, counted."""
    say.heading("heading.banded")
    L, W, H = 2048, 128, 1
    mask = mh.Mask.window(W) & mh.Mask.causal()
    q, k, v = (torch.randn(1, H, L, 16, generator=g) for _ in range(3))
    decision = mh.dispatch(q, k, v, mask)
    story.table([say("label.backend"), say("label.dispatch-says")],
                [[f"{decision.backend} ✓", decision.detail], *map(list, decision.reasons.items())],
                title=say("label.dispatch"))
    out, banded = counted_attention(q, k, v, mask)
    dense_out, dense = counted_attention(q, k, v, mask, backend="sdpa")
    story.table([say("label.backend"), say("label.calls"), say("label.entries"), say("label.share")],
                [["banded (auto)", banded.calls, f"{banded.entries:,}", f"{banded.entries / dense.entries:.1%}"],
                 ["sdpa", dense.calls, f"{dense.entries:,}", "100%"]],
                title=say("label.work", L=L, W=W, H=H))
    skipped = f"{1 - banded.entries / dense.entries:.0%}"
    say.check("check.dispatch-banded", decision.backend == "banded" and skipped in decision.detail,
              say("detail.skipped", share=skipped))
    say.check("check.dense-computes-all", dense.entries == H * L * L, f"H * Lq * Lk = {H} * {L} * {L} = {H * L * L:,}")
    say.check("check.banded-same-output", max_diff(out, dense_out) < 1e-5, diff_text(out, dense_out))
    q2, k2, v2 = (torch.randn(1, H, 2 * L, 16, generator=g) for _ in range(3))
    _, longer = counted_attention(q2, k2, v2, mask)
    growth = longer.entries / banded.entries
    say.check("check.work-follows-window", 1.9 < growth < 2.1,
              say("detail.growth", long=f"{longer.entries:,}", short=f"{banded.entries:,}", growth=growth))


def tell_sinks(story: Story, say: Say, g: torch.Generator) -> None:
    """Four heads with four sinks: their weights against a softmax by hand, and what the sink takes."""
    say.heading("heading.sinks")
    say.text("text.sinks")
    say.code("code.sinks")
    H, Lq, D = 4, 5, 8
    q, k, v = (torch.randn(1, H, Lq, D, generator=g, dtype=torch.float64) for _ in range(3))
    sinks = torch.tensor([-2.0, 0.0, 2.0, 8.0], dtype=torch.float64)
    weights = sink_weights(q, k, sinks)                                   # (B, H, Lq, Lk)
    by_hand = softmax_with_sink(q, k, sinks)                              # (B, H, Lq, Lk + 1)
    plain, out = mh.attention(q, k, v), mh.attention(q, k, v, sinks=sinks)
    sums = weights[0].sum(-1)                                             # (H, Lq)
    story.table(["h", "sink", say("label.on-keys"), say("label.out-size")],
                [[h, f"{sinks[h]:g}", f"{sums[h].min():.3f} .. {sums[h].max():.3f}",
                  f"{out[0, h].norm() / plain[0, h].norm():.3f}"] for h in range(H)],
                title=say("label.sink-heads", Lq=Lq))
    keys_part, sink_part = by_hand[..., :-1], by_hand[..., -1]
    say.check("check.weights-by-hand", max_diff(weights, keys_part) < 1e-12, diff_text(weights, keys_part))
    rest = 1 - weights.sum(-1)
    say.check("check.below-one", bool((rest > 0).all()) and max_diff(rest, sink_part) < 1e-12,
              diff_text(rest, sink_part))
    say.check("check.plain-sums-to-one", max_diff(sink_weights(q, k, None).sum(-1), torch.ones(1, H, Lq)) < 1e-12)
    say.check("check.nowhere", float(out[0, 3].norm() / plain[0, 3].norm()) < 0.01,
              say("detail.norms", sunk=float(out[0, 3].norm()), plain=float(plain[0, 3].norm())), sink=f"{sinks[3]:g}")
    as_key = sink_as_zero_value_key(q, k, v, sinks)
    say.check("check.zero-value-key", max_diff(as_key, out) < 1e-12, diff_text(as_key, out))
    unsunk = mh.attention(q, k, v, sinks=torch.full((H,), NO_SINK, dtype=torch.float64))
    say.check("check.no-sink", max_diff(unsunk, plain) < 1e-12, diff_text(unsunk, plain), sink=f"{NO_SINK:g}")
    lse = torch.logsumexp(q @ k.transpose(-2, -1) / D**0.5, dim=-1, keepdim=True)     # (B, H, Lq, 1)
    rescaled = plain * torch.sigmoid(lse - sinks.view(1, H, 1, 1))                   # the sink's share taken out
    sink_decision = mh.dispatch(q, k, v, sinks=sinks)
    say.check("check.fused-rescale", max_diff(rescaled, out) < 1e-12 and sink_decision.backend == "sdpa",
              diff_text(rescaled, out))
