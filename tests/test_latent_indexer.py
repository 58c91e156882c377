"""MultiHeadLatentAttention with a lightning indexer (DeepSeek Sparse Attention): each query attends to its top-k keys.

The cases use top-k 3 over sequences of 9 to 12 keys, so the selection really drops keys.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from helpers import decoded_step_by_step, reference_mla
import multihead.layers.indexer as indexer_module
from multihead.layers.indexer import LightningIndexer, top_k_keys
from multihead.layers.latent import MultiHeadLatentAttention

E, H, C, Dn, R, Dv, CQ, HI, DI, TOP_K = 32, 4, 16, 8, 4, 6, 12, 8, 8, 3


def make_sparse(seed=0, *, shared=False, interleaved_index=False, dtype=torch.float32):
    """A causal MLA with low-rank queries and (unless shared) a lightning indexer keeping 3 keys per query."""
    torch.manual_seed(seed)
    indexer = None if shared else LightningIndexer(E, CQ, HI, DI, TOP_K,
                                                   rope=mh.RoPE(DI, rotary_dim=R, interleaved=interleaved_index))
    mla = MultiHeadLatentAttention(E, H, kv_lora_rank=C, qk_nope_head_dim=Dn, qk_rope_head_dim=R, v_head_dim=Dv,
                                   q_lora_rank=CQ, causal=True, indexer=indexer, shared_selection=shared)
    with torch.no_grad():
        for name, param in mla.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    return mla.to(dtype)


def keep_of(indices: torch.Tensor, Lk: int) -> torch.Tensor:
    """(B, 1, Lq, Lk) bool: True at the listed keys."""
    B, Lq, _ = indices.shape
    slots = torch.where(indices >= 0, indices, Lk)
    return torch.zeros(B, Lq, Lk + 1, dtype=torch.bool).scatter_(-1, slots, True)[:, None, :, :Lk]


def brute_force_selection(mla, x):
    """Each query's top-k keys, scored in float64 straight from the formula (causal): (B, L, K) sets."""
    ix, B, L = mla.indexer, x.shape[0], x.shape[1]
    q_resid = mla.q_a_layernorm(mla.q_a_proj(x))
    q, k, w = ix.project(x, q_resid, torch.arange(L))
    per_head = torch.relu(torch.einsum("bihd,bjd->bihj", q.double(), k.double()) * DI ** -0.5)
    scores = torch.einsum("bih,bihj->bij", w.double(), per_head)
    scores = scores.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    return [[set(row[:min(TOP_K, i + 1)].tolist()) for i, row in enumerate(b)] for b in scores.argsort(-1, True)]


def test_the_indexer_keeps_each_querys_top_k_causal_keys(monkeypatch):
    mla = make_sparse(0)
    x = torch.randn(2, 10, E)
    _, indices = mla(x, return_indices=True)
    picked = [[set(i for i in row.tolist() if i >= 0) for row in b] for b in indices]
    assert picked == brute_force_selection(mla, x)
    monkeypatch.setattr(indexer_module, "SCORE_BUDGET", 1)  # one query per block: the same picks
    assert torch.equal(mla(x, return_indices=True)[1], indices)
    assert (indices[:, :2] == -1).any() and indices.shape == (2, 10, TOP_K)  # early rows have fewer keys
    assert top_k_keys(torch.zeros(1, 1, 2), torch.tensor([[[False, True]]]), 2).tolist() == [[[1, -1]]]


@pytest.mark.parametrize("interleaved", [False, True])
def test_equals_float64_attention_over_the_selected_keys(interleaved):
    mla = make_sparse(1, interleaved_index=interleaved)
    x = torch.randn(2, 11, E)
    out, indices = mla(x, return_indices=True)
    keep = keep_of(indices, 11)
    torch.testing.assert_close(out.double(), reference_mla(mla, x, keep=keep), rtol=1e-5, atol=1e-5)
    assert (out.double() - reference_mla(mla, x)).abs().max() > 1e-2  # the selection matters
    torch.testing.assert_close(mla(x, absorb=True), out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("absorb", [None, False, True])
def test_prefill_then_steps_equal_the_whole_sequence(absorb):
    mla = make_sparse(2)
    x = torch.randn(2, 12, E)
    full = mla(x)
    cache = mla.new_cache(2, 12)
    rows = [mla(x[:, :5], cache=cache, absorb=absorb)] + [mla(x[:, i:i + 1], cache=cache, absorb=absorb)
                                                          for i in range(5, 12)]
    torch.testing.assert_close(torch.cat(rows, 1), full, rtol=1e-5, atol=1e-5)  # absorb= on every call
    assert cache.index_keys.shape == (2, 12, DI) and cache.index_keys.abs().min() > 0  # every slot written


def test_a_shared_layer_attends_to_the_keys_given():
    indexed, shared = make_sparse(3), make_sparse(3, shared=True)
    shared.load_state_dict({k: v for k, v in indexed.state_dict().items() if not k.startswith("indexer.")})
    x = torch.randn(2, 9, E)
    out, indices = indexed(x, return_indices=True)
    torch.testing.assert_close(shared(x, indices=indices), out, rtol=0, atol=1e-6)
    cache = shared.new_cache(2, 9)
    assert cache.index_keys is None
    steps = [shared(x[:, :4], cache=cache, indices=indices[:, :4, :])]
    steps += [shared(x[:, i:i + 1], cache=cache, indices=indices[:, i:i + 1]) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(steps, 1), out, rtol=1e-5, atol=1e-5)
    future = torch.full((2, 9, 1), 8)  # the last key for every query: only the last query may see it
    alone = shared(x, indices=future)  # o_proj has no bias: rows left with no key give zeros
    assert not alone[:, :8].any() and alone[:, 8].abs().min() > 0


def test_ragged_prompts_decode_each_sequence_by_its_own_length():
    mla = make_sparse(4)
    lens = torch.tensor([7, 4])
    x, step = torch.randn(2, 7, E), torch.randn(2, 1, E)
    cache = mla.new_cache(2, 8)
    prefill = mla(x, cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
    out = mla(step, cache=cache)
    for b, n in enumerate(lens.tolist()):
        expected = mla(torch.cat((x[b:b + 1, :n], step[b:b + 1]), 1))
        torch.testing.assert_close(prefill[b, :n], expected[0, :n], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(out[b, 0], expected[0, n], rtol=1e-5, atol=1e-5)


def test_grad_no_grad_and_inference_mode_agree():
    mla = make_sparse(5)
    x = torch.randn(1, 9, E)
    out = mla(x)
    out.square().sum().backward()
    assert mla.kv_b_proj.weight.grad.abs().sum() > 0 and mla.q_b_proj.weight.grad.abs().sum() > 0
    with torch.no_grad():
        torch.testing.assert_close(mla(x), out, rtol=0, atol=0)
    with torch.inference_mode():
        steps = decoded_step_by_step(mla, x, 3)
    torch.testing.assert_close(steps, out.detach(), rtol=1e-5, atol=1e-5)


def test_bf16_stays_within_twice_the_drift_of_a_bf16_dense_reference():
    mla = make_sparse(6)
    x = torch.randn(2, 12, E)
    with torch.no_grad():
        _, indices = mla(x, return_indices=True)
        exact = reference_mla(mla, x, keep=keep_of(indices, 12))
        low = make_sparse(6, shared=True, dtype=torch.bfloat16)
        low.load_state_dict({k: v for k, v in mla.state_dict().items() if not k.startswith("indexer.")})
        drift = (low(x.bfloat16(), indices=indices).double() - exact).abs().max().item()
        # the sparse bf16 layer picks its own keys: compare rows whose selection agrees with fp32's
        ours, picked = mla.to(torch.bfloat16)(x.bfloat16(), return_indices=True)
    same = (picked.sort(-1).values == indices.sort(-1).values).all(-1)  # (B, L)
    assert same.float().mean() > 0.75
    assert (ours.double() - exact).abs().amax(-1)[same].max().item() <= 2 * drift + 1e-3


def test_bad_selections_are_refused_and_leave_the_cache_unchanged():
    mla, shared = make_sparse(7), make_sparse(7, shared=True)
    cache, shared_cache = mla.new_cache(2, 6), shared.new_cache(2, 6)
    mla(torch.randn(2, 3, E), cache=cache)
    shared(torch.randn(2, 3, E), cache=shared_cache, indices=torch.zeros(2, 3, 1, dtype=torch.long))
    before = [[b.clone() for b in c.buffers()] for c in (cache, shared_cache)]
    step = torch.randn(2, 1, E)
    with pytest.raises(mh.AttentionError, match=r"indices must lie in \[-1, 4\)"):
        shared(step, cache=shared_cache, indices=torch.full((2, 1, 1), 4))
    with pytest.raises(mh.AttentionError, match="attends to the keys given as indices="):
        shared(step, cache=shared_cache)
    with pytest.raises(mh.AttentionError, match="attends to the keys given as indices="):
        mla(step, cache=cache, indices=torch.zeros(2, 1, 1, dtype=torch.long))
    with pytest.raises(mh.AttentionError, match="this latent cache has no indexer keys"):
        mla(step, cache=shared_cache)
    with pytest.raises(mh.AttentionError, match="may keep or block keys but not add scores"):
        mla(step.expand(2, 4, E), mask=mh.Mask.additive(torch.randn(4, 4)))
    with pytest.raises(mh.AttentionError, match="return_indices=True needs a sparse layer"):
        MultiHeadLatentAttention(E, H, kv_lora_rank=C, qk_nope_head_dim=Dn, qk_rope_head_dim=R, v_head_dim=Dv)(
            step, return_indices=True)
    for c, old in zip((cache, shared_cache), before):
        assert all(torch.equal(b, o) for b, o in zip(c.buffers(), old))
    with pytest.raises(mh.AttentionError, match="indexer must be an mh.LightningIndexer over embed_dim=32"):
        MultiHeadLatentAttention(E, H, kv_lora_rank=C, qk_nope_head_dim=Dn, qk_rope_head_dim=R, v_head_dim=Dv,
                                 indexer=mla.indexer)  # no q_lora_rank: nothing for the indexer to read
    with pytest.raises(mh.AttentionError, match="LightningIndexer top_k must be a positive int"):
        LightningIndexer(E, CQ, HI, DI, 0)


def test_the_cache_keeps_index_keys_through_reorder_resize_and_reset():
    mla = make_sparse(8)
    x, step = torch.randn(3, 4, E), torch.randn(3, 1, E)
    cache = mla.new_cache(3, 5)
    mla(x, cache=cache)
    bigger = cache.resized(torch.tensor([2, 0]), max_len=8)
    assert torch.equal(bigger.index_keys[:, :4], cache.index_keys[[2, 0], :4])
    fresh = mla.new_cache(2, 8)
    mla(x[[2, 0]], cache=fresh)
    torch.testing.assert_close(mla(step[[2, 0]], cache=bigger), mla(step[[2, 0]], cache=fresh))
    keys = cache.index_keys.clone()
    cache.reorder(torch.tensor([1, 1, 0]))
    assert torch.equal(cache.index_keys, keys[[1, 1, 0]])
    per_token = sum(b.nbytes for name, b in cache.named_buffers() if name != "lengths") // (3 * 5)
    assert cache.bytes_per_token() == per_token == (C + R + DI) * 4
    cache.reset()
    assert not cache.index_keys.any() and cache.held == 0


@pytest.mark.slow
def test_compiled_sparse_decode_step_matches_eager():
    mla = make_sparse(9).eval()
    x = torch.randn(1, 8, E)
    eager_cache, compiled_cache = mla.new_cache(1, 10), mla.new_cache(1, 10)
    step = torch.compile(lambda t, c: mla(t, cache=c), dynamic=True, fullgraph=True)
    with torch.no_grad():
        mla(x[:, :4], cache=eager_cache)
        mla(x[:, :4], cache=compiled_cache)
        for i in range(4, 8):  # from 5 keys on, the top 3 are gathered
            torch.testing.assert_close(step(x[:, i:i + 1], compiled_cache), mla(x[:, i:i + 1], cache=eager_cache),
                                       rtol=1e-5, atol=1e-6)
