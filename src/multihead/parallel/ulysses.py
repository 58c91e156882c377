"""Ulysses attention: two all-to-alls turn sequence shards into head shards and back.

Shapes: on rank r, q (B, H, Lq_r, D), k (B, Hkv, Lk_r, D), v (B, Hkv, Lk_r, Dv), shards of the
global sequence (see layout.py). H must divide by P, and Hkv by P or P by Hkv (with fewer kv heads
than ranks, as in multi-query attention, each kv head is repeated to P heads before the exchange).

    sequence shards (B, H, L_r, D) --all_to_all--> head shards (B, H/P, N, D), whole sequence
    mh.attention on H/P heads (any backend, the full mask: every rank sees every position)
    head shards (B, H/P, N, Dv) --all_to_all--> sequence shards (B, H, L_r, Dv)

Rank r receives query heads [r H/P, (r+1) H/P) and key/value heads [r Hkv/P, (r+1) Hkv/P): whole
kv groups, since head h uses kv head h // (H/Hkv). Gradients run the same exchanges backwards
(comm.AllToAll), and autograd differentiates the attention in between.
"""
from __future__ import annotations

import torch

from multihead.attention import attention
from multihead.parallel.comm import AllToAll
from multihead.parallel.layout import gathered_positions
from multihead.parallel.plan import SequencePlan, plan_sequence_call


def ulysses_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask=None, *, causal: bool = False,
                      layout: str, group=None) -> torch.Tensor:
    """Attention of this rank's query shard over the whole sequence, computed head-parallel.

    q (B, H, Lq_r, D), k (B, Hkv, Lk_r, D), v (B, Hkv, Lk_r, Dv): this rank's shards, cut with
    `shard_sequence(x, layout=<this call's layout>)` ("contiguous" or "zigzag", required, the same on
    every rank; both exact, zig-zag balances causal work); H must divide by the group size P, and Hkv by P
    (or P by Hkv: each rank then receives one whole kv head).
    mask: a Mask in global positions, the same on every rank (causal, Mask.lengths(valid_lens (B,)),
    Mask.key_padding(pad (B, N)), Mask.window, Mask.segments). Returns (B, H, Lq_r, Dv), equal to this
    rank's rows of mh.attention on the gathered tensors; differentiable. Bad input on any rank raises
    AttentionError on every rank.
    """
    plan = plan_sequence_call(q, k, v, mask, causal, layout, group, "ulysses_attention", heads_per_rank=True)
    if plan.Hkv % plan.world_size:  # fewer kv heads than ranks (MQA): each rank needs one whole kv head
        k, v = (t.repeat_interleave(plan.world_size // plan.Hkv, dim=1) for t in (k, v))  # (B, P, Lk_r, D)
    q_heads = sequence_to_heads(q, plan.q_lengths, plan)  # (B, H/P, Nq, D)
    k_heads = sequence_to_heads(k, plan.k_lengths, plan)  # (B, Hkv/P, Nk, D)
    v_heads = sequence_to_heads(v, plan.k_lengths, plan)  # (B, Hkv/P, Nk, Dv)
    out = attention(q_heads, k_heads, v_heads, mask, causal=causal)  # (B, H/P, Nq, Dv)
    return heads_to_sequence(out, plan.q_lengths, plan)  # (B, H, Lq_r, Dv)


def sequence_to_heads(x: torch.Tensor, lengths: tuple[int, ...], plan: SequencePlan) -> torch.Tensor:
    """(B, Hx, L_r, X) sequence shard -> (B, Hx/P, N, X): this rank's heads over the whole sequence,
    in position order. `lengths`: every rank's L."""
    P = plan.world_size
    B, Hx, L, X = x.shape
    h = Hx // P
    send = x.reshape(B, P, h, L, X).transpose(0, 1).reshape(-1)  # (P, B, h, L, X): block j goes to rank j
    out_splits = [B * h * n * X for n in lengths]
    got = AllToAll.apply(send, out_splits, [B * h * L * X] * P, plan.group)
    pieces = [p.view(B, h, n, X) for p, n in zip(got.split(out_splits), lengths)]
    return _to_position_order(torch.cat(pieces, dim=2), plan)  # (B, h, N, X)


def heads_to_sequence(y: torch.Tensor, lengths: tuple[int, ...], plan: SequencePlan) -> torch.Tensor:
    """(B, h, N, X) this rank's heads in position order -> (B, h*P, L_r, X) this rank's sequence shard."""
    P, rank = plan.world_size, plan.rank
    B, h, _, X = y.shape
    y = _to_rank_order(y, plan)
    send = torch.cat([part.reshape(-1) for part in y.split(list(lengths), dim=2)])  # rank j's positions to j
    L = lengths[rank]
    got = AllToAll.apply(send, [B * h * L * X] * P, [B * h * n * X for n in lengths], plan.group)
    return got.view(P, B, h, L, X).transpose(0, 1).reshape(B, P * h, L, X)  # heads of rank j at block j


def _to_position_order(x: torch.Tensor, plan: SequencePlan) -> torch.Tensor:
    """Shards concatenated in rank order -> position order (only the zig-zag layout needs a reorder)."""
    if not plan.zigzag:
        return x
    order = torch.argsort(gathered_positions(x.shape[2], plan.world_size, "zigzag", x.device))
    return x.index_select(2, order)


def _to_rank_order(x: torch.Tensor, plan: SequencePlan) -> torch.Tensor:
    """Position order -> every rank's shard concatenated in rank order."""
    if not plan.zigzag:
        return x
    return x.index_select(2, gathered_positions(x.shape[2], plan.world_size, "zigzag", x.device))
