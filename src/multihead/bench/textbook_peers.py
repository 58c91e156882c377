"""The textbook classes as shootout peers, each called the way its document calls it.

Causal attention in each document's own convention, built once outside the timed region:
000 an additive 0/1 mask (1 = blocked), 001 its registered triu buffer, 002 a keep mask (0 = blocked),
003 a sequence-first (Lq, Lk, 1) keep mask, 004 per-query valid_lens (B, Lq) = 1, 2, ..., N
(d2l's decoder self-attention). Without `causal`, no mask at all.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from multihead import textbook as tb
from multihead.bench.peers import Runner, Shape


def _tril(shape: Shape) -> torch.Tensor:
    """(N, N) bool, True on and below the diagonal = may attend."""
    return ~shape.causal_block()


def build_000(shape: Shape) -> Runner:
    mod = tb.ReshapeTransposeHeads(shape.embed, shape.heads)
    mask = shape.causal_block().to(shape.dtype) if shape.causal else None  # 1 = blocked
    return _runner("000 ReshapeTransposeHeads", mod, shape, lambda m, x: m(x, mask))


def build_001_stacked(shape: Shape) -> Runner:
    mod = tb.StackedHeads(shape.embed, shape.head_dim, shape.length, 0.0, shape.heads)
    return _runner("001 StackedHeads", mod, shape, lambda m, x: m(x), "always causal")


def build_001_split(shape: Shape) -> Runner:
    mod = tb.SplitHeads(shape.embed, shape.embed, shape.length, 0.0, shape.heads)
    return _runner("001 SplitHeads", mod, shape, lambda m, x: m(x), "always causal")


def build_002(shape: Shape) -> Runner:
    mod = tb.ClassicTransformerHeads(shape.embed, shape.heads)
    mask = _tril(shape) if shape.causal else None  # 0 = blocked
    return _runner("002 ClassicTransformerHeads", mod, shape, lambda m, x: m(x, x, x, mask))


def build_003(shape: Shape) -> Runner:
    mod = tb.SeqFirstEinsumHeads(shape.heads, shape.embed, dropout_prob=0.0)
    mask = _tril(shape)[:, :, None] if shape.causal else None  # (Lq, Lk, 1), 0 = blocked
    seq_first = shape.input().transpose(0, 1).contiguous()  # (N, B, E)
    return _runner("003 SeqFirstEinsumHeads", mod, shape, lambda m, _: m(seq_first, seq_first,
                                                                           seq_first, mask))


def build_004(shape: Shape) -> Runner:
    e = shape.embed
    mod = tb.FoldedBatchHeads(e, e, e, e, shape.heads, 0.0)
    lens = None
    if shape.causal:  # query i sees keys 0..i: (B, Lq)
        lens = torch.arange(1, shape.length + 1, device=shape.device).repeat(shape.batch, 1)
    return _runner("004 FoldedBatchHeads", mod, shape, lambda m, x: m(x, x, x, lens))


def _runner(name: str, mod, shape: Shape, call, note: str = "") -> Runner:
    mod = mod.to(device=shape.device, dtype=shape.dtype).eval()
    x = shape.input()
    return Runner(name, lambda: call(mod, x), mod, note)


TEXTBOOK_PEERS: dict[str, Callable[[Shape], Runner]] = {
    "000 ReshapeTransposeHeads": build_000,
    "001 StackedHeads": build_001_stacked,
    "001 SplitHeads": build_001_split,
    "002 ClassicTransformerHeads": build_002,
    "003 SeqFirstEinsumHeads": build_003,
    "004 FoldedBatchHeads": build_004,
}

# The scaling suite's N^2 peer, and how many (B, H, N, N) float32 score tensors its forward holds at
# once without autograd (scores, then the scaled/masked copy, then the softmax: two alive at a time).
MATERIALISING_PEER = "002 ClassicTransformerHeads"
SCORE_COPIES_ALIVE = 2
