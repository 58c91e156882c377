"""Ring attention: each rank keeps its queries; key/value blocks travel around the ring of ranks.

Shapes: q (B, H, Lq_r, D), k (B, Hkv, Lk_r, D), v (B, Hkv, Lk_r, Dv) on rank r, shards of the global
sequence, cut in the layout the caller names ("contiguous" or "zigzag"; see layout.py). Returns this rank's
(B, H, Lq_r, Dv) rows of attention over the whole sequence.

Forward, on rank r, for P steps: post the send of the block in hand to rank r+1 and the receive of
the next one from rank r-1 (batch_isend_irecv), attend from the local queries to the block in hand
tile by tile (lse.tile_forward), fold each tile in through its log-sum-exp (lse.merge), then wait.
After P steps every rank has met every key block once. Each rank keeps (out, lse) of its rows.

Backward is a second ring (written out in `RingAttention.backward`, not left to autograd): the
key/value blocks travel again, and with each block travel its gradient accumulators dk and dv; every
rank adds its share (lse.tile_backward with the final lse) and passes them on, and after P steps
they arrive back at the rank that owns the block. dq stays home. Memory per rank: the local shards,
the blocks in flight (the K/V block in hand and the next one arriving, the dK/dV accumulators
travelling and the next ones arriving), and one tile's (B, H, T, T) scores at a time (T = TILE).

Top-left causal tiles wholly above the diagonal are skipped from positions alone, in either layout;
the zig-zag layout gives every rank the same number of kept tiles.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.autograd.function import once_differentiable

from multihead.parallel.comm import ring_exchange
from multihead.parallel.layout import Segment
from multihead.parallel.lse import compute_dtype, merge, tile_backward, tile_forward
from multihead.parallel.plan import SequencePlan, plan_sequence_call
from multihead.parallel.sequence_masks import key_visible, tile_keep

TILE = 256  # positions per tile side: bounds the scores held at once to (B, H, TILE, TILE)


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, *, causal: bool = False,
                   layout: str, group=None) -> torch.Tensor:
    """Attention of this rank's query shard over the keys of every rank, passed around a ring.

    q (B, H, Lq_r, D), k (B, Hkv, Lk_r, D), v (B, Hkv, Lk_r, Dv): this rank's shards, cut with
    `shard_sequence(x, layout=<this call's layout>)`. layout: "contiguous" or "zigzag", required and
    the same on every rank (zig-zag balances causal work; both are exact).
    mask: a Mask in global positions, the same on every rank: causal, Mask.lengths(valid_lens (B,)),
    Mask.key_padding(pad (B, N)), Mask.window, Mask.segments. causal=True adds top-left causality.
    group: a ProcessGroup, a 1-D DeviceMesh, or None (the default group). Returns (B, H, Lq_r, Dv),
    equal to this rank's rows of mh.attention on the gathered tensors; differentiable.
    Bad input on any rank raises AttentionError on every rank.
    """
    plan = plan_sequence_call(q, k, v, mask, causal, layout, group, "ring_attention")
    k, v = _inert_keys(k, v, plan)
    return RingAttention.apply(q, k, v, plan)


def _inert_keys(k, v, plan: SequencePlan):
    """Zero the local keys no query may see (padding, lengths), so NaN stored there never reaches out."""
    visible = key_visible(plan.mask, plan.base_index(k.device), plan.k_segments(plan.rank))  # (B, 1, 1, Lk_r)
    if visible is None:
        return k, v
    hidden = ~visible.transpose(-1, -2)  # (B, 1, Lk_r, 1)
    return k.masked_fill(hidden, 0.0), v.masked_fill(hidden, 0.0)


@dataclass(frozen=True)
class Tile:
    """`size` positions starting at global position `start`, stored from index `local` of a shard."""

    local: int
    start: int
    size: int

    @property
    def rows(self) -> slice:
        return slice(self.local, self.local + self.size)

    @property
    def span(self) -> tuple[int, int]:
        return self.start, self.start + self.size


def tiles(segments: list[Segment], size: int | None = None) -> list[Tile]:
    """A shard made of `segments`, cut into tiles of at most `size` positions (default TILE)."""
    size = size or TILE
    out, local = [], 0
    for s, e in segments:
        out += [Tile(local + a - s, a, min(size, e - a)) for a in range(s, e, size)]
        local += e - s
    return out


def tile_pairs(plan: SequencePlan, q_tiles: list[Tile], src: int, device):
    """(q tile, k tile, keep) for each tile pair of our queries and rank `src`'s keys that keeps a key."""
    base = plan.base_index(device)
    for kt in tiles(plan.k_segments(src)):
        for qt in q_tiles:
            if plan.static_causal and kt.start > qt.start + qt.size - 1:
                continue  # every key comes after every query: nothing kept
            diagonal = plan.static_causal and kt.start + kt.size - 1 > qt.start
            yield qt, kt, tile_keep(plan.mask, base, qt.span, kt.span, diagonal, device)


def _block_shapes(plan: SequencePlan, src: int, widths: tuple[int, int], dtype) -> list:
    """(shape, dtype) of the two blocks rank `src` owns: (B, Hkv, Lk_src, width) each."""
    return [((plan.B, plan.Hkv, plan.k_lengths[src], w), dtype) for w in widths]


class RingAttention(torch.autograd.Function):
    """Forward and backward rings; see the module docstring. Inputs are this rank's shards."""

    @staticmethod
    def forward(ctx, q, k, v, plan: SequencePlan):
        acc = compute_dtype(q.dtype)
        B, H, Lq, _ = q.shape
        out = q.new_zeros((B, H, Lq, plan.Dv), dtype=acc)
        lse = q.new_full((B, H, Lq), float("-inf"), dtype=acc)
        q_tiles = tiles(plan.q_segments(plan.rank))
        blocks, src = [k, v], plan.rank
        for step in range(plan.world_size):
            last = step == plan.world_size - 1
            nxt = (src - 1) % plan.world_size  # the rank whose block arrives next
            pending = None if last else ring_exchange(blocks, _block_shapes(plan, nxt, (plan.D, plan.Dv), k.dtype),
                                                      plan.group)
            for qt, kt, keep in tile_pairs(plan, q_tiles, src, q.device):
                o, l = tile_forward(q[:, :, qt.rows], blocks[0][:, :, kt.rows], blocks[1][:, :, kt.rows], keep,
                                    plan.scale)
                merge(out[:, :, qt.rows], lse[:, :, qt.rows], o, l)
            if pending is not None:
                blocks, src = pending.wait(), nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out.to(q.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        plan: SequencePlan = ctx.plan
        acc = out.dtype
        dout = dout.to(acc)
        delta = (dout.unsqueeze(-2) @ out.unsqueeze(-1)).view(out.shape[:-1])  # (B, H, Lq): rowsum(dout * out)
        dq = torch.zeros_like(q, dtype=acc)
        q_tiles = tiles(plan.q_segments(plan.rank))
        blocks, src = [k, v], plan.rank
        grads = [torch.zeros_like(k, dtype=acc), torch.zeros_like(v, dtype=acc)]  # for the block in hand
        pending_grads = None
        for step in range(plan.world_size):
            last = step == plan.world_size - 1
            nxt = (src - 1) % plan.world_size
            pending = None if last else ring_exchange(blocks, _block_shapes(plan, nxt, (plan.D, plan.Dv), k.dtype),
                                                      plan.group)
            if pending_grads is not None:
                grads = pending_grads.wait()  # what the ranks before us added for this block
            for qt, kt, keep in tile_pairs(plan, q_tiles, src, q.device):
                dq_t, dk_t, dv_t = tile_backward(q[:, :, qt.rows], blocks[0][:, :, kt.rows], blocks[1][:, :, kt.rows],
                                                 keep, plan.scale, lse[:, :, qt.rows], dout[:, :, qt.rows],
                                                 delta[:, :, qt.rows])
                dq[:, :, qt.rows] += dq_t
                grads[0][:, :, kt.rows] += dk_t
                grads[1][:, :, kt.rows] += dv_t
            pending_grads = ring_exchange(grads, _block_shapes(plan, nxt, (plan.D, plan.Dv), acc), plan.group)
            if pending is not None:
                blocks, src = pending.wait(), nxt
        dk, dv = pending_grads.wait()  # our own block's gradients, back from the last rank that used it
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None
