"""The facts behind the sparse-attention topic, tested directly: the indexer's top-k and attention over the
picked keys by hand against the project's functions, the decode-step counts, V4's K = V layer by hand, its
turn back, the cache bytes; and broken facts show up as failed checks."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.explain import words
from multihead.explain.story import Story
from multihead.explain.topics import TOPICS
from multihead.explain.topics.models import shared_kv_head as v4
from multihead.explain.topics.models import sparse_attention as dsa
from multihead.explain.topics.decoding import flop_counts
from multihead.layers.indexer import select_keys
from multihead.positions.rotary import apply_rotary
from multihead.layers.selected_attention import attend_selected

SMALL = {"H": 4, "C": 16, "R": 4, "Hi": 2, "Di": 8, "K": 6}


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("L,K", [(5, 3), (9, 4), (6, 8)])
def test_the_indexer_by_hand_is_select_keys_with_minus_one_for_missing_keys(L, K):
    q, k, w = randn(2, L, 3, 8, seed=1), randn(2, L, 8, seed=2), randn(2, L, 3, seed=3)
    by_hand = dsa.top_k_by_hand(dsa.index_scores_by_hand(q, k, w), K)
    causal = torch.ones(L, L, dtype=torch.bool).tril()[None]
    assert torch.equal(by_hand, select_keys(q, k, w, 8 ** -0.5, causal, K))
    assert by_hand.shape == (2, L, min(K, L))
    assert (by_hand >= 0).sum(-1).tolist() == [[min(i + 1, K) for i in range(L)]] * 2
    assert bool((by_hand <= torch.arange(L).view(1, L, 1)).all())


@pytest.mark.parametrize("seed", range(4))
def test_attention_over_listed_keys_by_hand_is_attend_selected_and_masked_dense(seed):
    B, H, Lq, Lk, K = 2, 3, 5, 9, 4
    q, k, v = randn(B, H, Lq, 8, seed=seed), randn(B, 1, Lk, 8, seed=seed + 10), randn(B, 1, Lk, 8, seed=seed + 20)
    g = torch.Generator().manual_seed(seed)
    indices = torch.stack([torch.randperm(Lk, generator=g)[:K] for _ in range(B * Lq)]).view(B, Lq, K)
    indices[:, 0, 1:] = -1                                                     # a query with one key
    keep = dsa.keep_of(indices, Lk)
    assert keep.shape == (B, 1, Lq, Lk) and keep.sum().item() == (indices >= 0).sum().item()
    by_hand = dsa.attend_listed_by_hand(q, k, v, indices)
    torch.testing.assert_close(by_hand, attend_selected(q, k, v, indices), rtol=0, atol=1e-12)
    torch.testing.assert_close(by_hand, mh.attention(q, k, v, mh.Mask.keep(keep)), rtol=0, atol=1e-12)
    torch.testing.assert_close(by_hand[:, :, 0], v[torch.arange(B), 0, indices[:, 0, 0]][:, None].expand(B, H, 8))


@pytest.mark.parametrize("N", [4, 6, 20])
def test_step_costs_counted_on_meta_tensors_equal_counts_on_real_ones(N):
    s, dense, sparse = SMALL, dsa.step_cost(N, False, SMALL), dsa.step_cost(N, True, SMALL)
    per_key = s["H"] * (2 * s["C"] + s["R"])
    assert dense.macs == N * per_key and sparse.attend_macs == min(N, s["K"]) * per_key
    assert sparse.index_macs == s["Hi"] * N * (s["Di"] + 1)
    assert dense.bytes == N * (s["C"] + s["R"]) * 2
    assert sparse.bytes == (N * s["Di"] + min(N, s["K"]) * (s["C"] + s["R"])) * 2
    q, rows = randn(1, s["H"], 1, s["C"] + s["R"]), randn(1, 1, N, s["C"] + s["R"], seed=1)
    picked = torch.randperm(N)[:min(N, s["K"])].view(1, 1, -1)
    real = flop_counts(lambda: attend_selected(q, rows, rows[..., :s["C"]], picked, backend="sparse"))["bmm"] // 2
    assert real == sparse.attend_macs
    index = flop_counts(lambda: select_keys(randn(1, 1, s["Hi"], s["Di"]), randn(1, N, s["Di"]), randn(1, 1, s["Hi"]),
                                            1.0, None, s["K"]))["bmm"] // 2
    assert index == sparse.index_macs


@pytest.mark.parametrize("W,L", [(3, 10), (6, 10), (16, 7)])
def test_v4_by_hand_is_the_module_and_its_cache_rows(W, L):
    layer = v4.small_v4(W)
    x = randn(2, L, layer.embed_dim)
    cache = layer.new_cache(2, L)
    with torch.no_grad():
        out, kv = v4.shared_kv_by_hand(layer, x)
        torch.testing.assert_close(v4.project_out(layer, out), layer(x), rtol=0, atol=1e-6)  # module: float32 angles
        layer(x, cache=cache)
    torch.testing.assert_close(cache.window_rows(), kv[:, :, -(W - 1):], rtol=0, atol=1e-6)


@pytest.mark.parametrize("shift", [1, 37, 1000])
def test_the_turned_back_output_depends_on_distances_only(shift):
    layer = v4.small_v4()
    x, R = randn(1, 8, layer.embed_dim, seed=5), layer.rope.head_dim
    with torch.no_grad():
        here, there = v4.shared_kv_by_hand(layer, x)[0], v4.shared_kv_by_hand(layer, x, start=shift)[0]
        raw = [v4.shared_kv_by_hand(layer, x, start=s, turn_back=False)[0] for s in (0, shift)]
    torch.testing.assert_close(here, there, rtol=0, atol=1e-11)
    torch.testing.assert_close(raw[0][..., :-R], raw[1][..., :-R], rtol=0, atol=1e-12)
    assert (raw[0][..., -R:] - raw[1][..., -R:]).abs().max() > 1e-3


def test_turn_last_turns_only_the_last_r_features_and_back_undoes_it():
    x, positions = randn(2, 3, 5, 12), torch.arange(5) * 7
    turned = v4.turn_last(x, positions, 4)
    assert torch.equal(turned[..., :-4], x[..., :-4])
    torch.testing.assert_close(turned.norm(dim=-1), x.norm(dim=-1))        # a rotation keeps lengths
    torch.testing.assert_close(v4.turn_last(turned, positions, 4, back=True), x, rtol=0, atol=1e-12)
    rope = mh.RoPE(4, interleaved=True)
    cos, sin = rope.cos_sin(positions, torch.float64)
    torch.testing.assert_close(turned[..., -4:], apply_rotary(x[..., -4:], cos, sin, True), rtol=0, atol=1e-6)


def test_cache_bytes_per_token_follow_the_formulas():
    got = v4.per_token_bytes(M=32, dtype=torch.float32)
    assert got == {"gqa": 8 * 256 * 4, "mqa": 1024 * 4, "mla": 576 * 4, "v32": 704 * 4, "v4": 512 * 4,
                   "csa": (512 + 128) / 4 * 4}


@pytest.mark.models
def test_the_sizes_are_the_released_configs():
    transformers = pytest.importorskip("transformers")
    v32, v3 = transformers.DeepseekV32Config(), transformers.DeepseekV3Config()
    v4_config = transformers.DeepseekV4Config()
    mistral = transformers.MistralConfig()
    assert dsa.V32 == {"H": v32.num_attention_heads, "C": v32.kv_lora_rank, "R": v32.qk_rope_head_dim,
                       "Hi": v32.index_n_heads, "Di": v32.index_head_dim, "K": v32.index_topk}
    assert v4.V3 == {"C": v3.kv_lora_rank, "R3": v3.qk_rope_head_dim, "Di32": v32.index_head_dim}
    assert v4.V4 == {"H": v4_config.num_attention_heads, "D": v4_config.head_dim, "R": v4_config.qk_rope_head_dim,
                     "W": v4_config.sliding_window, "m": v4_config.compress_rates["compressed_sparse_attention"],
                     "Di": v4_config.index_head_dim, "topk": v4_config.index_topk}
    assert v4.GQA == {"Hkv": mistral.num_key_value_heads, "Dg": mistral.hidden_size // mistral.num_attention_heads}


def test_a_learners_mistakes_fail_their_own_checks(monkeypatch):
    """Three mistakes at once, each caught by its own claim: topk over the queries (dim=-2) instead of the
    keys; -1 slots read as the last key instead of no key; the output not turned back."""
    def wrong_axis(scores, K):
        return scores.topk(K, dim=-2).indices.transpose(-1, -2)

    def unmasked(q, k, v, indices):
        return listed(q, k, v, torch.where(indices >= 0, indices, k.shape[2] - 1))

    def never_back(layer, x, start=0, turn_back=True):
        return by_hand(layer, x, start, turn_back=False)

    listed, by_hand = dsa.attend_listed_by_hand, v4.shared_kv_by_hand
    monkeypatch.setattr(dsa, "top_k_by_hand", wrong_axis)
    monkeypatch.setattr(dsa, "attend_listed_by_hand", unmasked)
    monkeypatch.setattr(v4, "shared_kv_by_hand", never_back)
    story = Story()
    TOPICS["sparse-attention"].run(story)
    claims = story.failed_checks
    told = words.topic_words("en", "sparse-attention")
    assert claims[0].startswith(told["check.by-hand-picks"].split("{")[0])
    assert claims[1] == told["check.selected-equals-masked"]
    assert claims[2].startswith(told["check.v4-by-hand"].split("{")[0])
    assert claims[3].startswith(told["check.turned-back-stays"].split("{")[0]) and len(claims) == 4
