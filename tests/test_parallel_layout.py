"""The pieces of multihead.parallel that need no process group: splits, tiles, the LSE merge, masks, costs."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from helpers import randn64
from multihead.parallel import cost, layout, lse
from multihead.parallel.ring import tiles
from multihead.parallel.sequence_masks import (check_sequence_mask, fingerprint, is_causal_call,
                                               split_static_causal, tile_keep)


# --- splits ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("N, chunks", [(16, 4), (13, 4), (7, 7), (37, 6)])
def test_chunks_follow_tensor_split(N, chunks):
    expected = [len(c) for c in torch.arange(N).tensor_split(chunks)]
    assert [e - s for s, e in layout.chunk_bounds(N, chunks)] == expected


@pytest.mark.parametrize("shards", layout.LAYOUTS)
@pytest.mark.parametrize("N, P", [(16, 2), (19, 4), (64, 4), (9, 3)])
def test_every_position_lives_on_exactly_one_rank(N, P, shards):
    held = torch.cat([layout.positions(layout.sequence_segments(N, P, r, shards)) for r in range(P)])
    assert torch.equal(held.sort().values, torch.arange(N))
    assert torch.equal(held, layout.gathered_positions(N, P, shards))
    assert sum(layout.shard_lengths(N, P, shards)) == N


def test_zigzag_gives_rank_r_chunk_r_and_its_mirror():
    chunks = layout.chunk_bounds(16, 8)
    for r in range(4):
        assert layout.sequence_segments(16, 4, r, "zigzag") == [chunks[r], chunks[7 - r]]


@pytest.mark.parametrize("P", [2, 4, 8])
def test_zigzag_balances_causal_work_where_contiguous_does_not(P):
    N = 16 * P

    def work(shards):  # kept (query, key) pairs per rank under a causal mask: query i keeps i + 1 keys
        return [int((layout.positions(layout.sequence_segments(N, P, r, shards)) + 1).sum()) for r in range(P)]

    assert len(set(work("zigzag"))) == 1
    contiguous = work("contiguous")
    assert contiguous[-1] > (2 * P - 2) * contiguous[0]  # the last rank: nearly 2P-1 times the first's work


@pytest.mark.parametrize("bad", [None, "zig-zag", "causal", True, 2])
def test_a_layout_other_than_contiguous_or_zigzag_is_refused(bad):
    for call in (lambda: layout.check_layout(bad, "here"), lambda: layout.sequence_segments(16, 2, 0, bad),
                 lambda: layout.min_length(2, bad)):
        with pytest.raises(mh.AttentionError, match='layout must be "contiguous" or "zigzag"'):
            call()


def test_lengths_tell_the_layouts_apart_only_where_they_differ():
    """What the calls can check: N=7 over 2 ranks is [4, 3] contiguous but [3, 4] zig-zag; N=16 is [8, 8] both."""
    assert layout.shard_lengths(7, 2, "contiguous") == [4, 3] and layout.shard_lengths(7, 2, "zigzag") == [3, 4]
    assert layout.shard_lengths(16, 2, "contiguous") == layout.shard_lengths(16, 2, "zigzag") == [8, 8]
    assert layout.min_length(4, "zigzag") == 8 and layout.min_length(4, "contiguous") == 4


def test_shard_sequence_needs_a_tensor_and_a_dim_in_range():
    with pytest.raises(mh.AttentionError):
        layout._check_dim(torch.zeros(2, 3), 2)
    assert layout._check_dim(torch.zeros(2, 3), -1) == 1


# --- tiles ---------------------------------------------------------------------------------------------

def test_tiles_cover_each_segment_in_shard_order():
    segments = [(0, 7), (20, 25)]
    cut = tiles(segments, size=3)
    assert [(t.local, t.start, t.size) for t in cut] == [(0, 0, 3), (3, 3, 3), (6, 6, 1), (7, 20, 3), (10, 23, 2)]
    assert torch.equal(torch.cat([torch.arange(*t.span) for t in cut]), layout.positions(segments))


# --- the log-sum-exp merge and the tile gradients, against float64 autograd ----------------------------

def _reference(q, k, v, keep, scale):
    """softmax attention in float64 with blocked entries 0; rows that keep nothing give 0."""
    G = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    s = (q @ k.transpose(-1, -2) * scale).masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w @ v


@pytest.mark.parametrize("Hkv", [4, 2, 1])
def test_tiles_merged_through_their_lse_equal_whole_attention_and_its_gradients(Hkv):
    B, H, Lq, Lk, D = 2, 4, 6, 11, 5
    q, k, v, dout = randn64(B, H, Lq, D, seed=0), randn64(B, Hkv, Lk, D, seed=1), randn64(B, Hkv, Lk, D, seed=2), \
        randn64(B, H, Lq, D, seed=3)
    keep = torch.rand(B, 1, Lq, Lk, generator=torch.Generator().manual_seed(4)) > 0.4
    keep[1, :, 2] = False  # a row that keeps no key
    scale = D ** -0.5
    out = torch.zeros(B, H, Lq, D, dtype=torch.float64)
    total = torch.full((B, H, Lq), float("-inf"), dtype=torch.float64)
    cuts = [(0, 4), (4, 5), (5, 11)]
    for a, b in reversed(cuts):  # any order gives the same result
        o, l = lse.tile_forward(q, k[:, :, a:b], v[:, :, a:b], keep[..., a:b], scale)
        lse.merge(out, total, o, l)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = _reference(*leaves, keep, scale)
    expected.backward(dout)
    torch.testing.assert_close(out, expected.detach(), rtol=0, atol=1e-12)
    assert torch.equal(out[1, :, 2], torch.zeros(H, D)) and torch.isinf(total[1, :, 2]).all()
    delta = (dout * out).sum(-1)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for a, b in cuts:
        tq, tk, tv = lse.tile_backward(q, k[:, :, a:b], v[:, :, a:b], keep[..., a:b], scale, total, dout, delta)
        dq += tq
        dk[:, :, a:b] += tk
        dv[:, :, a:b] += tv
    for mine, leaf in zip((dq, dk, dv), leaves):
        torch.testing.assert_close(mine, leaf.grad, rtol=0, atol=1e-12)


def test_tiles_compute_in_at_least_float32():
    assert lse.compute_dtype(torch.bfloat16) == torch.float32 and lse.compute_dtype(torch.float64) == torch.float64


# --- masks on global positions ---------------------------------------------------------------------------

def test_tile_keep_equals_the_whole_mask_read_at_those_positions():
    B, H, N = 2, 3, 12
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[1, -4:] = True
    mask = mh.Mask.key_padding(pad) & mh.Mask.lengths(torch.tensor([9, 12]), query_lens=torch.tensor([12, 10])) \
        & mh.Mask.window(4)
    whole, _ = mask.materialize(B, H, N, N)
    whole = whole & torch.ones(N, N, dtype=torch.bool).tril()  # with top-left causal
    base = mask.normal_form().index(B, H, N, N, "cpu")
    for (q0, q1), (k0, k1) in (((2, 6), (3, 9)), ((8, 12), (0, 12)), ((0, 3), (0, 3))):
        got = tile_keep(mask, base, (q0, q1), (k0, k1), diagonal=True)
        assert torch.equal(got.expand(B, 1, q1 - q0, k1 - k0), whole[:, :, q0:q1, k0:k1].expand(B, 1, -1, -1))


@pytest.mark.parametrize("mask, message", [
    (mh.Mask.additive(torch.zeros(4, 4)), "cannot shard by sequence"),
    (mh.Mask.alibi(torch.ones(2)), "cannot shard by sequence"),
    (mh.Mask.keep(torch.ones(4, 4, dtype=torch.bool)), "varies by query or head"),
    ("causal", "must be a multihead.Mask"),
])
def test_masks_a_sharded_sequence_cannot_take_are_refused(mask, message):
    with pytest.raises(mh.AttentionError, match=message):
        check_sequence_mask(mask, "ring_attention")


def test_causal_calls_are_recognised_and_top_left_causality_is_handled_from_positions():
    pad = mh.Mask.key_padding(torch.zeros(1, 8, dtype=torch.bool))
    assert not is_causal_call(pad, False) and is_causal_call(pad, True)
    assert is_causal_call(pad & mh.Mask.causal("bottom_right"), False)
    static, rest = split_static_causal(pad & mh.Mask.causal(), False)
    assert static and rest is not None and len(rest.parts) == 1
    static, rest = split_static_causal(mh.Mask.causal("bottom_right"), False)
    assert not static and len(rest.parts) == 1


def test_fingerprint_tells_masks_apart_by_kind_shape_and_values():
    a, b = mh.Mask.lengths(torch.tensor([3, 4])), mh.Mask.lengths(torch.tensor([3, 5]))
    assert fingerprint(a) == fingerprint(mh.Mask.lengths(torch.tensor([3, 4])))
    assert len({fingerprint(None), fingerprint(a), fingerprint(b), fingerprint(a & mh.Mask.causal())}) == 4


# --- the communication model ------------------------------------------------------------------------------

def test_heads_traffic_is_one_all_reduce_forward_and_one_per_projection_backward():
    forward = cost.heads_bytes(B=2, L=8, E=64, O=64, P=4, item=4)
    assert forward == 2 * 3 * (2 * 8 * 64 * 4) // 4
    assert cost.heads_bytes(B=2, L=8, E=64, O=64, P=4, item=4, backward=True) == 4 * forward


def test_seconds_divides_bytes_by_bandwidth_and_adds_latency():
    assert cost.seconds(9e11, 900) == pytest.approx(1.0)
    assert cost.seconds(0, 50, latency_us=5, messages=4) == pytest.approx(20e-6)
