"""The facts behind the kv-cache, rope and window-and-sinks topics, tested directly against torch's own
attention and hand-written float64 references: each test fails if the topic's claim were false."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import multihead as mh
from multihead.explain import words
from multihead.explain.story import Story
from multihead.explain.topics import TOPICS, decoding, rope, window_sinks


def randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def rotate_complex(x: torch.Tensor, positions: torch.Tensor, base: float, interleaved: bool) -> torch.Tensor:
    """RoPE written as complex multiplication (the form of the RoFormer paper), float64: pair j of x
    (B, H, L, D) is the complex number a + ib, multiplied by exp(i * position * base^(-2j/D))."""
    D = x.shape[-1]
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :D // 2], x[..., D // 2:])
    angle = positions.double()[:, None] * base ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)   # (L, D/2)
    turned = torch.complex(a, b) * torch.polar(torch.ones_like(angle), angle)
    if interleaved:
        return torch.stack((turned.real, turned.imag), dim=-1).flatten(-2)
    return torch.cat((turned.real, turned.imag), dim=-1)


# --- kv-cache: the cost of a decode step ---------------------------------------------------------

def reference_step_flops(B: int, H: int, N: int, D: int) -> int:
    """FLOPs of one query row per head against N keys, the attention written out by hand."""
    q = torch.empty(B, H, 1, D, device="meta")
    k, v = torch.empty(B, H, N, D, device="meta"), torch.empty(B, H, N, D, device="meta")
    return sum(decoding.flop_counts(lambda: (q @ k.transpose(-2, -1)).softmax(-1) @ v).values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("H,Hkv,N,B", [(4, 4, 33, 1), (4, 2, 100, 2), (6, 1, 17, 3)])
def test_a_decode_step_reads_every_cached_number_for_one_multiply_add(dtype, H, Hkv, N, B):
    attn = mh.MultiHeadAttention(8 * H, H, num_kv_heads=Hkv, bias=False, backend="math", dtype=dtype)
    attention, projections = decoding.decode_step_cost(attn, N, batch=B)
    size = torch.empty(0, dtype=dtype).element_size()
    assert attention.flops == reference_step_flops(B, H, N, 8) == 4 * B * H * N * 8
    assert attention.bytes == 2 * B * Hkv * N * 8 * size
    assert attention.intensity == pytest.approx(2 * (H / Hkv) / size)         # no N in it
    E = 8 * H
    assert projections.flops == 2 * B * (2 * E * E + 2 * E * (8 * Hkv))        # 2 FLOPs per weight, per row
    assert projections.bytes == (2 * E * E + 2 * E * 8 * Hkv) * size
    assert projections.intensity == pytest.approx(2 * B / size)


@pytest.mark.parametrize("N", [16, 300])
def test_prefill_and_a_gemm_reuse_what_they_read(N):
    cost = decoding.prefill_attention_cost(4, 4, N, 8, torch.bfloat16)
    assert cost.flops == 4 * 4 * N * N * 8 and cost.bytes == 4 * (4 * N * 8) * 2
    assert cost.intensity == N / 2
    gemm = decoding.gemm_cost(N, torch.bfloat16)
    assert gemm.flops == 2 * N ** 3 and gemm.intensity == pytest.approx(2 * N / (3 * 2))


# --- kv-cache: causal alignment --------------------------------------------------------------

@pytest.mark.parametrize("Lq,Lk", [(1, 6), (3, 6), (2, 9), (5, 5)])
def test_the_mask_patterns_are_the_triangles(Lq, Lk):
    full = torch.ones(Lq, Lk, dtype=torch.bool)
    show = lambda keep: ["".join("■" if x else "·" for x in row) for row in keep.tolist()]   # noqa: E731
    assert decoding.causal_rows("top_left", Lq, Lk) == show(full.tril())
    assert decoding.causal_rows("bottom_right", Lq, Lk) == show(full.tril(Lk - Lq))
    assert decoding.keep_rows(None, 2, 3) == ["■■■", "■■■"]


@pytest.mark.parametrize("N", [2, 8, 13])
def test_a_lone_query_aligned_top_left_sees_only_key_0(N):
    q, k, v = randn(1, 2, N, 4, seed=1), randn(1, 2, N, 4, seed=2), randn(1, 2, N, 4, seed=3)
    last = q[:, :, -1:]
    assert torch.equal(F.scaled_dot_product_attention(last, k, v, is_causal=True), v[:, :, :1])   # torch itself
    assert torch.equal(mh.attention(last, k, v, mh.Mask.causal("top_left")), v[:, :, :1])
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(mh.attention(last, k, v, mh.Mask.causal("bottom_right")), full[:, :, -1:])


@pytest.mark.parametrize("n", [2, 3, 5])
def test_a_chunk_of_new_tokens_needs_bottom_right(n):
    q, k, v = randn(2, 2, 7, 4, seed=4), randn(2, 2, 7, 4, seed=5), randn(2, 2, 7, 4, seed=6)
    full = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(mh.attention(q[:, :, -n:], k, v, mh.Mask.causal("bottom_right")), full[:, :, -n:])
    assert (mh.attention(q[:, :, -n:], k, v, mh.Mask.causal("top_left")) - full[:, :, -n:]).abs().max() > 0.1


# --- kv-cache: incremental equals full ---------------------------------------------------------

@pytest.mark.parametrize("Hkv,use_rope,prompt", [(4, False, 1), (2, True, 4), (1, True, 3)])
def test_cache_steps_equal_the_full_causal_forward(Hkv, use_rope, prompt):
    torch.manual_seed(Hkv)
    attn = mh.MultiHeadAttention(16, 4, num_kv_heads=Hkv, rope=mh.RoPE(4) if use_rope else None).double()
    x = randn(2, 9, 16, seed=7)
    outs, cache = decoding.decode_step_by_step(attn, x, prompt)
    assert [o.shape[1] for o in outs] == [prompt] + [1] * (9 - prompt)
    assert cache.lengths.tolist() == [9, 9]
    with torch.no_grad():
        torch.testing.assert_close(torch.cat(outs, 1), attn(x, causal=True), atol=1e-12, rtol=1e-12)


def test_the_cache_holds_keys_turned_to_their_positions():
    torch.manual_seed(0)
    attn = mh.MultiHeadAttention(16, 4, num_kv_heads=2, rope=mh.RoPE(4)).double()
    x = randn(1, 6, 16, seed=8)
    _, cache = decoding.decode_step_by_step(attn, x, 2)
    with torch.no_grad():
        plain = attn.k_proj(x).view(1, 6, 2, 4).transpose(1, 2)
    by_hand = rotate_complex(plain, torch.arange(6), 10000.0, interleaved=False)
    torch.testing.assert_close(decoding.turned_keys(attn, x), by_hand, atol=1e-6, rtol=1e-6)   # float32 angles
    torch.testing.assert_close(cache.keys, decoding.turned_keys(attn, x), atol=1e-12, rtol=1e-12)


# --- rope --------------------------------------------------------------------------------------

@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("D,base", [(4, 10000.0), (8, 10000.0), (16, 500.0)])
def test_rope_turns_each_pair_by_position_times_frequency_and_keeps_lengths(D, base, interleaved):
    positions = torch.tensor([0, 1, 5, 37, 100])   # the topic's range: float32 angles err ~1e-7 * position
    x = randn(2, 3, 5, D, seed=9)
    turned, _ = mh.RoPE(D, base=base, interleaved=interleaved)(x, x, positions)
    torch.testing.assert_close(turned, rotate_complex(x, positions, base, interleaved), atol=1e-5, rtol=1e-5)
    want = torch.remainder(positions.double()[:, None] * base ** (-torch.arange(0, D, 2).double() / D) + math.pi,
                           2 * math.pi) - math.pi
    assert torch.allclose(rope.expected_angles(positions, D, base), want)
    gap = rope.wrap(rope.turned_angles(x, turned, interleaved) - want)
    assert gap.abs().max() < rope.ANGLE_TOL
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(torch.hypot(*rope.pairs(turned, interleaved)), torch.hypot(*rope.pairs(x, interleaved)),
                               atol=1e-6, rtol=1e-6)


def test_turned_angles_reads_back_a_known_rotation():
    x = randn(1, 1, 1, 4, seed=10)
    angles = torch.tensor([0.3, -2.0], dtype=torch.float64)
    a, b = x[..., :2], x[..., 2:]
    turned = torch.cat((a * angles.cos() - b * angles.sin(), b * angles.cos() + a * angles.sin()), -1)
    torch.testing.assert_close(rope.turned_angles(x, turned)[0, 0, 0], angles)
    assert rope.wrap(torch.tensor([3 * math.pi / 2])).item() == pytest.approx(-math.pi / 2)


@pytest.mark.parametrize("offset", [1, 17, 1000])
def test_rope_scores_depend_only_on_the_relative_position(offset):
    r = mh.RoPE(8)
    q, k = randn(1, 2, 6, 8, seed=11), randn(1, 2, 6, 8, seed=12)
    start = rope.roped_scores(r, q, k, torch.arange(6))
    turned_q, turned_k = (rotate_complex(t, torch.arange(6), 10000.0, False) for t in (q, k))
    by_hand = turned_q @ turned_k.transpose(-2, -1)
    torch.testing.assert_close(start, by_hand, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rope.roped_scores(r, q, k, torch.arange(6) + offset), start, atol=rope.SHIFT_TOL, rtol=0)
    torch.testing.assert_close(rope.relative_scores(r, q, k), start, atol=rope.ANGLE_TOL, rtol=0)
    one_q, one_k = randn(8, seed=13).expand(1, 1, 6, 8), randn(8, seed=14).expand(1, 1, 6, 8)
    same = rope.roped_scores(r, one_q, one_k, torch.arange(6))
    assert rope.is_toeplitz(same[0, 0], rope.ANGLE_TOL)
    assert not rope.is_toeplitz(start[0, 0], 1e-3)                       # different vectors: no such pattern


def test_added_absolute_positions_are_not_shift_invariant():
    q, k, table = randn(1, 1, 5, 8, seed=15), randn(1, 1, 5, 8, seed=16), randn(40, 8, seed=17)
    added = lambda p: rope.scores(q + table[p], k + table[p])   # noqa: E731
    assert (added(torch.arange(5) + 30) - added(torch.arange(5))).abs().max() > 0.1


@pytest.mark.parametrize("D", [2, 4, 8, 16])
def test_the_two_layouts_are_one_rotation_on_reordered_features(D):
    half, inter = mh.RoPE(D), mh.RoPE(D, interleaved=True)
    assert rope.partners(half) == [(f + D // 2) % D for f in range(D)]
    assert rope.partners(inter) == [f ^ 1 for f in range(D)]
    order = rope.interleave_order(D)
    assert sorted(order) == list(range(D)) and order[:2] == [0, D // 2]
    q, k = randn(2, 3, 7, D, seed=18), randn(2, 3, 7, D, seed=19)
    pos = torch.arange(7) * 3
    torch.testing.assert_close(inter(q[..., order], k[..., order], pos)[0], half(q, k, pos)[0][..., order])
    torch.testing.assert_close(rope.roped_scores(inter, q[..., order], k[..., order], pos),
                               rope.roped_scores(half, q, k, pos))
    if D > 2:   # with one pair the two layouts coincide
        assert (rope.roped_scores(inter, q, k, pos) - rope.roped_scores(half, q, k, pos)).abs().max() > 0.1


# --- window-and-sinks: the window ---------------------------------------------------------------

@pytest.mark.parametrize("L,W", [(8, 3), (6, 1), (5, 9), (12, 4)])
def test_the_window_keeps_the_last_w_keys(L, W):
    band = torch.ones(L, L, dtype=torch.bool).tril() & ~torch.ones(L, L, dtype=torch.bool).tril(-W)
    assert torch.equal(window_sinks.window_keep(L, W), band)
    q, k, v = randn(1, 2, L, 4, seed=20), randn(1, 2, L, 4, seed=21), randn(1, 2, L, 4, seed=22)
    reference = F.scaled_dot_product_attention(q, k, v, attn_mask=band)
    torch.testing.assert_close(window_sinks.last_keys_attention(q, k, v, W), reference)
    torch.testing.assert_close(mh.attention(q, k, v, mh.Mask.window(W) & mh.Mask.causal()), reference)


def test_score_count_counts_each_kernel_call():
    q, k, v = randn(2, 3, 5, 4, seed=23).float(), randn(2, 3, 9, 4, seed=24).float(), randn(2, 3, 9, 4, seed=25).float()
    with window_sinks.ScoreCount() as count:
        F.scaled_dot_product_attention(q, k, v)
        F.scaled_dot_product_attention(q[:, :, :2], k, v)
    assert (count.calls, count.entries) == (2, 2 * 3 * 5 * 9 + 2 * 3 * 2 * 9)


@pytest.mark.parametrize("W", [64, 128])
def test_the_banded_backend_computes_about_lq_times_w_scores(W):
    L = 2048
    mask = mh.Mask.window(W) & mh.Mask.causal()
    q, k, v = (randn(1, 1, L, 8, seed=s, dtype=torch.float32) for s in (26, 27, 28))
    assert mh.dispatch(q, k, v, mask).backend == "banded"
    out, count = window_sinks.counted_attention(q, k, v, mask)
    assert L * W <= count.entries <= L * (W + 512) and count.entries < 0.2 * L * L
    band = torch.ones(L, L, dtype=torch.bool).tril() & ~torch.ones(L, L, dtype=torch.bool).tril(-W)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=band), atol=1e-5, rtol=1e-5)
    _, dense = window_sinks.counted_attention(q, k, v, mask, backend="sdpa")
    assert dense.entries == L * L


# --- window-and-sinks: sinks --------------------------------------------------------------------

def sink_reference(q, k, v, sinks):
    """exp(s_j) / (exp(sink) + Σ exp(s)) written out, float64: (weights, out, the sink's share)."""
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    top = torch.maximum(s.amax(-1, keepdim=True), sinks.view(1, -1, 1, 1))
    e, e_sink = torch.exp(s - top), torch.exp(sinks.view(1, -1, 1, 1) - top)
    total = e.sum(-1, keepdim=True) + e_sink
    return e / total, (e / total) @ v, (e_sink / total)[..., 0]


@pytest.mark.parametrize("sinks", [[-2.0, 0.0, 2.0], [5.0, -1.0, 0.5], [30.0, 0.0, -30.0]])
def test_a_sink_joins_the_denominator_and_carries_no_value(sinks):
    sinks = torch.tensor(sinks, dtype=torch.float64)
    q, k, v = randn(2, 3, 4, 8, seed=29), randn(2, 3, 6, 8, seed=30), randn(2, 3, 6, 8, seed=31)
    weights, out, share = sink_reference(q, k, v, sinks)
    torch.testing.assert_close(window_sinks.sink_weights(q, k, sinks), weights)
    torch.testing.assert_close(window_sinks.softmax_with_sink(q, k, sinks)[..., :-1], weights)
    torch.testing.assert_close(window_sinks.softmax_with_sink(q, k, sinks)[..., -1], share)
    torch.testing.assert_close(mh.attention(q, k, v, sinks=sinks), out)
    torch.testing.assert_close(window_sinks.sink_as_zero_value_key(q, k, v, sinks), out)
    assert bool((window_sinks.sink_weights(q, k, sinks).sum(-1) < 1).all())
    torch.testing.assert_close(1 - weights.sum(-1), share)


def test_without_a_sink_rows_sum_to_one_and_a_very_negative_sink_is_no_sink():
    q, k, v = randn(1, 2, 5, 4, seed=32), randn(1, 2, 5, 4, seed=33), randn(1, 2, 5, 4, seed=34)
    torch.testing.assert_close(window_sinks.sink_weights(q, k, None).sum(-1), torch.ones(1, 2, 5, dtype=torch.float64))
    no_sink = torch.full((2,), window_sinks.NO_SINK, dtype=torch.float64)
    torch.testing.assert_close(mh.attention(q, k, v, sinks=no_sink), F.scaled_dot_product_attention(q, k, v),
                               atol=1e-12, rtol=1e-12)
    big = torch.full((2,), 12.0, dtype=torch.float64)
    assert mh.attention(q, k, v, sinks=big).norm() < 0.01 * F.scaled_dot_product_attention(q, k, v).norm()
    decision = mh.dispatch(q, k, v, sinks=big)
    assert decision.backend == "sdpa" and "log-sum-exp" in decision.detail



# --- the topics' checks are wired to these facts --------------------------------------------------

def failed(name: str) -> list[str]:
    story = Story()
    TOPICS[name].run(story)
    return story.failed_checks


def test_a_false_fact_fails_its_check(monkeypatch):
    said = lambda topic, key: words.fill(words.topic_words("en", topic)[key], {"W": 3})   # noqa: E731
    monkeypatch.setattr(rope, "interleave_order", lambda D: list(range(D)))   # the features not reordered
    assert failed("rope") == [said("rope", "check.same-rotation"), said("rope", "check.same-scores")]
    window = window_sinks.last_keys_attention
    monkeypatch.setattr(window_sinks, "last_keys_attention", lambda q, k, v, W: window(q, k, v, W + 1))
    by_hand = window_sinks.softmax_with_sink
    monkeypatch.setattr(window_sinks, "softmax_with_sink", lambda q, k, sinks: by_hand(q, k, 0 * sinks))   # sinks lost
    assert failed("window-and-sinks") == [said("window-and-sinks", key) for key in
                                          ("check.window-equals-slices", "check.weights-by-hand", "check.below-one")]
