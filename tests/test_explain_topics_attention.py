"""The facts behind the keys-vs-values, lse-merge and gqa-memory topics, tested directly against torch's
own attention: each test fails if the topic's claim were false."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import multihead as mh
from multihead.explain.topics import blockwise, keys_values, kv_cache


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# --- keys-vs-values -----------------------------------------------------------------------------

def test_keys_used_as_values_is_attention_with_the_keys_as_values():
    q, k, v = randn(2, 3, 5, 4, seed=1), randn(2, 3, 6, 4, seed=2), randn(2, 3, 6, 4, seed=3)
    wrong = keys_values.keys_as_values(q, k, v)
    torch.testing.assert_close(wrong, F.scaled_dot_product_attention(q, k, k))
    assert (wrong - F.scaled_dot_product_attention(q, k, v)).abs().max() > 0.1
    torch.testing.assert_close(keys_values.keys_as_values(q, k, k), F.scaled_dot_product_attention(q, k, k))


def test_the_weights_depend_on_queries_and_keys_only():
    q, k, v = randn(1, 2, 4, 8, seed=4), randn(1, 2, 7, 8, seed=5), randn(1, 2, 7, 8, seed=6)
    reference = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), -1)
    out_a, weights_a = keys_values.recorded_weights(q, k, v)
    out_b, weights_b = keys_values.recorded_weights(q, k, 2 * v + 1)
    assert torch.equal(weights_a, weights_b) and not torch.allclose(out_a, out_b)
    torch.testing.assert_close(weights_a.double(), reference, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(keys_values.attention_weights(q, k), reference)


def test_one_hot_values_fetch_the_weights_themselves():
    q, k = randn(1, 2, 5, 4, seed=7), randn(1, 2, 5, 4, seed=8)
    eye = torch.eye(5, dtype=torch.float64).expand(1, 2, 5, 5)
    torch.testing.assert_close(F.scaled_dot_product_attention(q, k, eye), keys_values.attention_weights(q, k))


def test_heads_of_and_the_tied_module():
    torch.manual_seed(0)
    attn = mh.MultiHeadAttention(8, 2, bias=False).double()
    x = randn(3, 5, 8, seed=9)
    q, k, v = keys_values.heads_of(attn, x)
    assert q.shape == (3, 2, 5, 4)
    with torch.no_grad():
        torch.testing.assert_close(attn.out_proj(F.scaled_dot_product_attention(q, k, v).transpose(1, 2)
                                                 .reshape(3, 5, 8)), attn(x))
    tied = keys_values.tied_module(attn)
    assert torch.equal(tied.v_proj.weight, attn.k_proj.weight) and torch.equal(tied.q_proj.weight, attn.q_proj.weight)


# --- lse-merge ----------------------------------------------------------------------------------

@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11])
def test_blockwise_attention_is_the_full_softmax(size):
    q, k, v = randn(2, 3, 4, 6, seed=10), randn(2, 3, 11, 6, seed=11), randn(2, 3, 11, 6, seed=12)
    out, lse = blockwise.blockwise_attention(q, k, v, size)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-12, rtol=1e-12)
    scores = q @ k.transpose(-2, -1) / math.sqrt(6)
    torch.testing.assert_close(lse[..., 0], torch.logsumexp(scores, -1), atol=1e-12, rtol=1e-12)
    order = torch.randperm(len(blockwise.blocks(11, size)), generator=torch.Generator().manual_seed(size)).tolist()
    shuffled, _ = blockwise.blockwise_attention(q, k, v, size, order=order)
    torch.testing.assert_close(shuffled, out, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(blockwise.block_shares(q, k, size).sum(0), torch.ones(2, 3, 4, dtype=torch.float64))


@pytest.mark.parametrize("seed", range(4))
def test_blockwise_attention_with_a_mask_and_blind_blocks(seed):
    q, k, v = randn(1, 2, 6, 4, seed=seed), randn(1, 2, 9, 4, seed=seed + 10), randn(1, 2, 9, 4, seed=seed + 20)
    keep = torch.rand(6, 9, generator=torch.Generator().manual_seed(seed)) > 0.6
    keep[:, 4] = True                                            # every query keeps one key
    keep[:3, 6:] = False                                         # queries 0-2 see nothing of the last block
    out, _ = blockwise.blockwise_attention(q, k, v, 3, keep=keep)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=keep), atol=1e-12, rtol=1e-12)


def test_a_blind_block_has_no_say_in_the_merge():
    q, k, v = randn(1, 1, 2, 4, seed=30), randn(1, 1, 3, 4, seed=31), randn(1, 1, 3, 4, seed=32)
    blind = blockwise.block_partial(q, k, v, keep=torch.zeros(2, 3, dtype=torch.bool))
    assert torch.equal(blind[0], torch.zeros_like(blind[0])) and bool(torch.isneginf(blind[1]).all())
    seen = blockwise.block_partial(q, k, v)
    merged = blockwise.merge(seen, blind)
    assert torch.equal(merged[0], seen[0]) and torch.equal(merged[1], seen[1])
    both_blind = blockwise.merge(blind, blind)
    assert torch.equal(both_blind[0], torch.zeros_like(both_blind[0]))


def test_averaging_blocks_is_not_the_softmax_and_large_scores_overflow_naively():
    q, k, v = randn(1, 1, 3, 8, seed=40), randn(1, 1, 8, 8, seed=41), randn(1, 1, 8, 8, seed=42)
    halves = [blockwise.block_partial(q, k[..., c, :], v[..., c, :])[0] for c in blockwise.blocks(8, 4)]
    assert (torch.stack(halves).mean(0) - F.scaled_dot_product_attention(q, k, v)).abs().max() > 1e-3
    assert blockwise.naive_softmax_overflows(torch.tensor([[89.0, 1.0]]))
    assert not blockwise.naive_softmax_overflows(torch.tensor([[80.0, 1.0]]))
    big = (40 * q).float(), k.float(), v.float()
    out, _ = blockwise.blockwise_attention(*big, 4)
    torch.testing.assert_close(out.double(), F.scaled_dot_product_attention(40 * q, k, v), atol=1e-5, rtol=1e-5)


# --- gqa-memory ---------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("layers,H,Hkv,D", [(1, 4, 4, 8), (3, 8, 2, 16), (2, 6, 1, 4)])
def test_the_cache_formula_is_what_a_built_cache_holds(dtype, layers, H, Hkv, D):
    modules = [mh.MultiHeadAttention(H * D, H, num_kv_heads=Hkv, head_dim=D, dtype=dtype) for _ in range(layers)]
    tokens = 7
    with torch.no_grad():
        cache = kv_cache.build_cache(modules, torch.randn(2, tokens, H * D, dtype=dtype))
    assert all(k.shape == v.shape == (2, Hkv, tokens, D) for k, v in cache)
    bytes_held = sum(t.numel() * t.element_size() for pair in cache for t in pair)
    assert kv_cache.measured_bytes_per_token(cache, tokens) == bytes_held / tokens
    assert bytes_held == 2 * kv_cache.cache_bytes_per_token(layers, Hkv, D, dtype) * tokens   # batch of 2


@pytest.mark.parametrize("H,Hkv", [(8, 2), (6, 3), (4, 1), (4, 4)])
def test_gqa_is_mha_with_repeated_kv_heads(H, Hkv):
    q, k, v = randn(2, H, 5, 4, seed=50), randn(2, Hkv, 5, 4, seed=51), randn(2, Hkv, 5, 4, seed=52)
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(mh.attention(q, k, v, causal=True), reference)
    g = H // Hkv
    torch.testing.assert_close(mh.attention(q, kv_cache.repeat_kv(k, g), kv_cache.repeat_kv(v, g), causal=True),
                               reference)
    if 1 < Hkv < H:
        tiled = F.scaled_dot_product_attention(q, k.repeat(1, g, 1, 1), v.repeat(1, g, 1, 1), is_causal=True)
        assert (tiled - reference).abs().max() > 1e-3


def test_the_gqa_module_equals_its_mha_twin():
    torch.manual_seed(0)
    gqa = mh.MultiHeadAttention(32, 8, num_kv_heads=2, bias=False).double()
    mha = kv_cache.as_mha(gqa)
    assert mha.num_kv_heads == 8 and mha.k_proj.out_features == 4 * gqa.k_proj.out_features
    x = randn(2, 6, 32, seed=60)
    with torch.no_grad():
        torch.testing.assert_close(mha(x, causal=True), gqa(x, causal=True), atol=1e-12, rtol=1e-12)
    D = gqa.head_dim
    for h in range(8):   # query head h's key projection is kv head h // 4's
        assert torch.equal(mha.k_proj.weight[h * D:(h + 1) * D], gqa.k_proj.weight[(h // 4) * D:(h // 4 + 1) * D])
