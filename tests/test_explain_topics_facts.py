"""The facts behind each topic's claims, tested directly: each test fails if its claim were false."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics import heads, heads_meaning, layout, masking, memory, python_syntax, scores
from multihead.explain.topics.base import error_of, error_text, max_diff, pick, stride_text
from multihead.textbook import StackedHeads, transpose_output, transpose_qkv

SIZES = [(1, 3, 2, 2), (2, 4, 4, 3), (3, 5, 3, 2)]   # (B, L, H, D)


# --- base helpers ------------------------------------------------------------------------------

def test_base_helpers():
    assert pick(Story(lang="zh"), "a", "甲") == "甲" and pick(Story(lang="en"), "a", "甲") == "a"
    err = error_of(lambda: torch.zeros(2, 3).view(4))
    assert isinstance(err, RuntimeError) and error_text(err).startswith("RuntimeError: ")
    assert error_of(lambda: None) is None and error_text(None) == "(no error)"
    assert max_diff(torch.zeros(2), torch.tensor([0.0, -0.5])) == 0.5
    assert error_text(AssertionError()) == "AssertionError()"   # a bare assert says nothing
    t = torch.zeros(2, 3)
    assert stride_text(Story(lang="en"), t) == "stride (3, 1)"
    assert stride_text(Story(lang="zh"), t, t.t()) == "步幅 (3, 1) -> (1, 3)"


# --- layout: reshape-then-transpose, split-heads-transpose, combine-heads ----------------------------

@pytest.mark.parametrize("B,L,H,D", SIZES)
def test_reshape_then_transpose_is_clean_and_direct_reshape_mixes(B, L, H, D):
    x = layout.labelled_tensor(B, L, H, D)
    assert layout.misplaced(layout.split_right(x, H)) == []
    wrong = layout.split_wrong(x, H)
    assert layout.misplaced(wrong), "direct reshape would have to mix tokens and heads"
    assert {head for _, head in layout.slot_sources(wrong, 0)} != {0}          # head slot 0 gets other heads
    assert [t for t, _ in layout.slot_sources(wrong, 0)][:2] == [0, 0]          # and repeats token 0


def test_labelled_values_decode_to_their_position():
    x = layout.labelled_tensor(2, 3, 2, 2)
    assert layout.decode(x[1, 2, 3].item()) == (1, 2, 1, 1)                     # feature 3 = head 1, feature 1


@pytest.mark.parametrize("B,L,H,D", SIZES)
def test_combine_heads_inverts_the_split_and_needs_contiguous(B, L, H, D):
    x = layout.labelled_tensor(B, L, H, D)
    heads_ = layout.split_right(x, H).contiguous()
    assert torch.equal(layout.combine_heads(heads_), x)
    if H > 1 and L > 1:
        with pytest.raises(RuntimeError):
            heads_.transpose(1, 2).view(B, L, H * D)


def test_transpose_swaps_strides_without_copying():
    v = layout.labelled_tensor(1, 3, 2, 2).view(1, 3, 2, 2)
    t = v.transpose(1, 2)
    assert t.data_ptr() == v.data_ptr() and t.stride() == (12, 2, 4, 1) and v.stride() == (12, 4, 2, 1)


# --- memory: memory-order, view-vs-contiguous ----------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 3), (4, 1, 5), (2, 3, 4, 5)])
def test_row_major_strides_are_the_strides_of_a_contiguous_tensor(shape):
    assert memory.row_major_strides(shape) == torch.empty(shape).stride()


def test_transpose_keeps_memory_order_and_reshape_follows_logical_order():
    x = torch.arange(6).reshape(2, 3)
    assert memory.memory_order(x.t()).tolist() == list(range(6))
    assert memory.shares_memory(x.t(), x)
    copied = x.t().reshape(6)
    assert copied.tolist() == [0, 3, 1, 4, 2, 5] and not memory.shares_memory(copied, x)


def test_split_heads_memory_stays_token_major_until_contiguous():
    split = layout.split_right(layout.labelled_tensor(1, 3, 2, 2), 2)
    tokens = [layout.decode(v)[1] for v in memory.memory_order(split).tolist()]
    heads_ = [layout.decode(v)[2] for v in memory.memory_order(split.contiguous()).tolist()]
    assert tokens == sorted(tokens) and heads_ == sorted(heads_) and not split.is_contiguous()


# --- python syntax: size-unpacking, underscore-placeholder, farward-typo ----------------------------

def test_typos_raise_what_the_topic_shows():
    errors = python_syntax.call_errors()
    assert isinstance(errors["model(x)"], NotImplementedError)
    assert isinstance(errors["scores.mask_fill(...)"], AttributeError)


def test_unpacking_needs_one_name_per_dimension():
    x = torch.zeros(3, 2, 5, 4)
    with pytest.raises(ValueError):
        python_syntax._three_of_four(x)
    assert python_syntax._repeat_underscore(x) == (3, 5) and python_syntax._starred(x) == [4]


def test_calling_farward_by_hand_skips_hooks():
    model, fixed, x = python_syntax.ForwardTypo(), python_syntax.ForwardFixed(), torch.ones(1, 4)
    assert python_syntax.hooks_seen(model, lambda: model.farward(x)) == 0
    assert python_syntax.hooks_seen(fixed, lambda: fixed(x)) == 1


# --- scores: k-transpose, einsum-scores, scale-sqrt-dk ---------------------------------------------

def test_q_times_k_transposed_is_every_query_key_dot_product():
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 3, 4, 5, generator=g, dtype=torch.float64)
    k = torch.randn(2, 3, 6, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(q @ k.transpose(-2, -1), scores.scores_by_loops(q, k))
    with pytest.raises(RuntimeError):
        torch.matmul(q, k)


def test_einsum_equals_the_batched_matmul():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 2, 3, 5, generator=g, dtype=torch.float64)
    k = torch.randn(6, 2, 3, 5, generator=g, dtype=torch.float64)
    torch.testing.assert_close(scores.einsum_as_matmul(q, k), torch.einsum("ibhd,jbhd->ijbh", q, k))


def test_unscaled_softmax_saturates_and_scaled_does_not():
    raw_small, raw_big = scores.saturation(4, scaled=False), scores.saturation(1024, scaled=False)
    scaled = [scores.saturation(d, scaled=True) for d in (4, 1024)]
    assert raw_big["max_weight"] > 0.9 > raw_small["max_weight"]
    assert abs(raw_big["std"] / math.sqrt(1024) - 1) < 0.15
    assert all(0.15 < s["max_weight"] < 0.35 and abs(s["std"] - 1) < 0.15 for s in scaled)
    assert raw_big["grad"] < 0.25 * scaled[1]["grad"]


# --- masking: masked-fill, mask-fill-value, mask-asserts ----------------------------------------------

def test_fill_values_and_fully_masked_rows():
    assert masking.fill_in(torch.float16) == float("-inf") and masking.fill_in(torch.float16, -1e6) == float("-inf")
    assert masking.fill_in(torch.float32) == -1e9
    shown = [masking.fill_text(masking.fill_in(d)) for d in (torch.float16, torch.bfloat16, torch.float32)]
    assert shown == ["-inf", "-9.98244e+08", "-1e+09"]   # bfloat16 cannot hold -1e9 exactly
    row, none = torch.randn(1, 4), torch.zeros(1, 4, dtype=torch.int64)
    assert masking.masked_weights(row, none, float("-inf")).isnan().all()
    torch.testing.assert_close(masking.masked_weights(row, none, -1e9), torch.full((1, 4), 0.25))
    with pytest.raises(RuntimeError):
        row.half().masked_fill(none == 0, -1e9)
    assert (torch.ones(3).half() * 0 * torch.tensor(-1e9, dtype=torch.float16)).isnan().all()


def test_fill_zero_leaks_and_minus_1e9_blocks():
    s = torch.randn(3, 3, dtype=torch.float64)
    keep = masking.CAUSAL_KEEP
    assert (masking.masked_weights(s, keep, 0.0)[keep == 0] > 0).all()
    assert (masking.masked_weights(s, keep, -1e9)[keep == 0] == 0).all()


def test_mh_attention_zeroes_fully_masked_rows_in_half():
    q, k, v = (t.half() for t in masking._qkv(dtype=torch.float32))
    keep = torch.tensor([[1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    out = mh.attention(q, k, v, mask=mh.Mask.keep(keep))
    assert torch.isfinite(out).all() and (out[..., 2, :] == 0).all()


SHAPES = [(a, b, c) for a in (1, 2, 4) for b in (1, 5) for c in (1, 2, 4)]


@pytest.mark.parametrize("shape", SHAPES)
def test_assert_verdicts_match_the_documents_asserts(shape):
    query_shape, key_shape = (4, 2, 8), (5, 2, 8)
    verdict = masking.assert_verdicts(shape, query_shape, key_shape)
    if all(verdict):
        out = masking.labml_mask_asserts(torch.ones(shape), query_shape, key_shape)
        assert torch.broadcast_shapes(out.shape, (4, 5, 2, 3)) == (4, 5, 2, 3)
    else:
        with pytest.raises(AssertionError):
            masking.labml_mask_asserts(torch.ones(shape), query_shape, key_shape)


def test_the_walkthroughs_batch_key_query_layout_is_rejected():
    assert not all(masking.assert_verdicts((2, 5, 4), (4, 2, 8), (5, 2, 8)))


# --- heads: linear-d-model, stacked-vs-split, param-count, head-cost -------------------------------

def test_one_big_projection_is_h_small_ones():
    big = nn.Linear(8, 8).double()
    x = torch.randn(3, 8, dtype=torch.float64)
    pieces = heads.small_projections(big, 4)
    torch.testing.assert_close(torch.cat([p(x) for p in pieces], dim=-1), big(x))


@pytest.mark.parametrize("H", [1, 2, 4])
def test_split_equals_stacked_with_h_times_fewer_calls(H):
    torch.manual_seed(H)
    stacked = StackedHeads(4, 2, 6, 0.0, num_heads=H)
    split = heads.split_from_stacked(stacked, 6)
    x = torch.randn(2, 6, 4)
    torch.testing.assert_close(split(x), stacked(x))
    a, b = heads.count_calls(lambda: stacked(x)), heads.count_calls(lambda: split(x))
    assert (a["matmul"], a["softmax"], a["linear"]) == (2 * H, H, 3 * H)
    assert (b["matmul"], b["softmax"], b["linear"]) == (2, 1, 4)


def test_matmul_flops_count_two_per_multiply_add():
    lin = nn.Linear(4, 6)
    assert heads.matmul_flops(lambda: lin(torch.zeros(2, 5, 4))) == 2 * 2 * 5 * 6 * 4
    assert heads.matmul_flops(lambda: torch.zeros(3, 2, 7) @ torch.zeros(3, 7, 5)) == 2 * 3 * 2 * 5 * 7


@pytest.mark.parametrize("num_hiddens", [16, 32])
def test_parameter_count_does_not_depend_on_the_number_of_heads(num_hiddens):
    counts = heads.d2l_param_counts(num_hiddens)
    assert set(counts) == {1, 2, 4, 8} and len(set(counts.values())) == 1
    assert len({heads.param_count(mh.MultiHeadAttention(num_hiddens, H)) for H in (1, 2, 4, 8)}) == 1


@pytest.mark.parametrize("num_hiddens", [16, 32])
def test_document_004s_claim_counts_stacked_full_width_heads_plus_one_w_o(num_hiddens):
    """The claim (Wq, Wk, Wv times num_heads) is exactly the stacked design with one W_o after it."""
    claimed = heads.claimed_param_counts(heads.d2l_param_counts(num_hiddens), num_hiddens)
    for H, count in claimed.items():
        stacked = heads.param_count(StackedHeads(num_hiddens, num_hiddens, 4, 0.0, num_heads=H))
        assert count == stacked + heads.param_count(nn.Linear(num_hiddens, num_hiddens, bias=False))


def test_median_ms_restores_the_thread_count():
    before = torch.get_num_threads()
    assert heads.median_ms(lambda: None, runs=3) >= 0
    assert torch.get_num_threads() == before


# --- heads_meaning: where-heads-live, heads-in-batch, heads-vs-conv --------------------------------

@pytest.mark.parametrize("H", [1, 2, 4])
def test_multi_head_output_is_single_head_attention_per_slice(H):
    model = heads_meaning.d2l_model(H)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    torch.testing.assert_close(model(x, x, x, None), heads_meaning.per_slice_attention(model, x))


@pytest.mark.parametrize("B,L,H,D", SIZES)
def test_folding_heads_into_the_batch_keeps_every_element_and_inverts(B, L, H, D):
    X = layout.labelled_tensor(B, L, H, D)
    folded = transpose_qkv(X, H)
    assert folded.numel() == X.numel() and heads_meaning.folded_rows_ok(folded, H)
    assert torch.equal(transpose_output(folded, H), X)
    if H > 1:
        assert not heads_meaning.folded_rows_ok(X.reshape(B * H, L, D), H)   # a naive fold is wrong


def test_conv_parameters_grow_with_kernels():
    assert [heads.param_count(nn.Conv1d(16, C, 3)) for C in (1, 2, 4)] == [49, 98, 196]
