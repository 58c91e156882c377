"""LatentCache: prefill then single steps equal the full forward; KVCache's interface and refusals."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.caches.latent import LatentCache
from test_latent import make_mla


@pytest.mark.parametrize("absorb", [None, False, True])
def test_prefill_then_steps_equal_the_full_forward(absorb):
    mla = make_mla(0, q_lora_rank=8)
    x = torch.randn(2, 9, 32)
    full = mla(x)
    cache = mla.new_cache(2, 12)
    rows = [mla(x[:, :4], cache=cache, absorb=absorb)]
    rows += [mla(x[:, i:i + 1], cache=cache, absorb=absorb) for i in range(4, 9)]
    torch.testing.assert_close(torch.cat(rows, dim=1), full, rtol=1e-5, atol=1e-6)
    assert cache.lengths.tolist() == [9, 9] and cache.held == 9
    assert cache.latents.shape == (2, 12, 16) and cache.rope_keys.shape == (2, 12, 4)
    assert cache.bytes_per_token() == (16 + 4) * 4


def test_ragged_batch_decodes_each_sequence_by_its_own_length():
    mla = make_mla(1)
    lens = torch.tensor([5, 3])
    x = torch.randn(2, 5, 32)
    cache = mla.new_cache(2, 8)
    prefill = mla(x, cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
    step = torch.randn(2, 1, 32)
    out = mla(step, cache=cache)
    assert cache.lengths.tolist() == [6, 4]
    for b, n in enumerate(lens.tolist()):  # each row alone, unpadded, equals its batched rows
        alone = torch.cat((x[b:b + 1, :n], step[b:b + 1]), dim=1)
        expected = mla(alone)
        torch.testing.assert_close(prefill[b, :n], expected[0, :n], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(out[b, 0], expected[0, n], rtol=1e-5, atol=1e-6)


def test_reorder_and_reset():
    mla = make_mla(2)
    x = torch.randn(3, 4, 32)
    cache = mla.new_cache(3, 6)
    mla(x, cache=cache)
    before = cache.keys.clone()
    cache.reorder(torch.tensor([2, 2, 0]))
    assert torch.equal(cache.keys, before[[2, 2, 0]])
    assert torch.equal(cache.latents, before[[2, 2, 0], 0, :, :16])
    step = torch.randn(3, 1, 32)
    fresh = mla.new_cache(3, 6)
    mla(x[[2, 2, 0]], cache=fresh)
    torch.testing.assert_close(mla(step, cache=cache), mla(step, cache=fresh))
    cache.reset()
    assert cache.lengths.tolist() == [0, 0, 0] and not cache.keys.any()


def test_bad_calls_raise_and_leave_the_cache_unchanged():
    mla = make_mla(3)
    cache = mla.new_cache(2, 5)
    mla(torch.randn(2, 3, 32), cache=cache)
    state = (cache.keys.clone(), cache.lengths.clone())

    def unchanged():
        return torch.equal(cache.keys, state[0]) and torch.equal(cache.lengths, state[1])

    with pytest.raises(mh.AttentionError, match="max_len=5"):
        mla(torch.randn(2, 3, 32), cache=cache)
    assert unchanged()
    with pytest.raises(mh.AttentionError, match="the cache is for batch 2"):
        mla(torch.randn(3, 1, 32), cache=cache)
    assert unchanged()
    with pytest.raises(mh.AttentionError, match="reorder indices must lie in"):
        cache.reorder(torch.tensor([0, 2]))
    assert unchanged()
    with pytest.raises(mh.AttentionError, match="with a cache, mask may only be"):
        mla(torch.randn(2, 1, 32), cache=cache, mask=mh.Mask.causal())
    assert unchanged()
    with pytest.raises(mh.AttentionError, match="cache must be a LatentCache"):
        mla(torch.randn(2, 1, 32), cache="cache")
    with pytest.raises(mh.AttentionError, match=r"latent cache rope_key must be \(B=2, Lq, 4\)"):
        cache.append_latent(torch.randn(2, 1, 16), torch.randn(2, 1, 5))
    with pytest.raises(mh.AttentionError, match="cache holds torch.float32"):
        cache.append_latent(torch.randn(2, 1, 16).double(), torch.randn(2, 1, 4).double())
    assert unchanged()
    with pytest.raises(mh.AttentionError, match="latent_dim must be a positive int"):
        LatentCache(1, 4, 0, 4)
    with pytest.raises(mh.AttentionError, match="max_len must be a positive int"):
        LatentCache(1, 0, 8, 4)


def test_a_plain_kv_cache_is_refused():
    mla = make_mla(4)
    with pytest.raises(mh.AttentionError, match="cache must be a LatentCache from mla.new_cache"):
        mla(torch.randn(1, 1, 32), cache=mh.KVCache(1, 4, 1, 20))
    with pytest.raises(mh.AttentionError, match=r"the cache is for batch 1, 1 kv heads of size 28"):
        mla(torch.randn(1, 1, 32), cache=LatentCache(1, 4, 24, 4))


@pytest.mark.slow
def test_compiled_decode_step_matches_eager():
    mla = make_mla(5).eval()
    x = torch.randn(1, 6, 32)
    eager_cache, compiled_cache = mla.new_cache(1, 8), mla.new_cache(1, 8)
    step = torch.compile(lambda t, c: mla(t, cache=c), dynamic=True, fullgraph=True)
    with torch.no_grad():
        mla(x[:, :4], cache=eager_cache)
        mla(x[:, :4], cache=compiled_cache)
        for i in (4, 5):
            torch.testing.assert_close(step(x[:, i:i + 1], compiled_cache), mla(x[:, i:i + 1], cache=eager_cache),
                                       rtol=1e-5, atol=1e-6)


def test_resized_copies_the_chosen_sequences_with_more_room():
    mla = make_mla(6)
    x = torch.randn(2, 3, 32)
    cache = mla.new_cache(2, 4)
    mla(x, cache=cache)
    bigger = cache.resized(torch.tensor([1, 1, 0]), max_len=9)
    assert bigger.max_len == 9 and bigger.lengths.tolist() == [3, 3, 3]
    assert torch.equal(bigger.keys[:, :, :3], cache.keys[[1, 1, 0], :, :3])
    step = torch.randn(3, 1, 32)
    fresh = mla.new_cache(3, 9)
    mla(x[[1, 1, 0]], cache=fresh)
    torch.testing.assert_close(mla(step, cache=bigger), mla(step, cache=fresh))
    with pytest.raises(mh.AttentionError, match="resized expects max_len >= 3"):
        cache.resized(max_len=2)
    with pytest.raises(mh.AttentionError, match="resized indices must lie in"):
        cache.resized(torch.tensor([2]))


def test_attend_cached_takes_the_callers_mask_over_every_cached_key():
    """Left padding as transformers does it: row 1's first two tokens are padding, blocked by the caller's
    mask and skipped by its positions; its real tokens then match the row alone, unpadded."""
    mla = make_mla(7)
    x = torch.randn(2, 5, 32)
    real = torch.tensor([[True] * 5, [False] * 2 + [True] * 3])  # (B, L) keys that are real tokens
    keep = real[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()  # (B, 1, Lq, Lk)
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)  # (B, L): row 1 starts at 0 after its padding
    cache = mla.new_cache(2, 6)
    out = mla.attend_cached(x, cache, positions, mh.Mask.keep(keep))
    alone = mla(x[1:, 2:])
    torch.testing.assert_close(out[1:, 2:], alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out[:1], mla(x[:1]), rtol=1e-5, atol=1e-6)
    step = torch.randn(2, 1, 32)
    keep_step = torch.cat((real, torch.ones(2, 1, dtype=torch.bool)), 1)[:, None, None, :]  # (B, 1, 1, 6)
    out = mla.attend_cached(step, cache, positions[:, -1:] + 1, mh.Mask.keep(keep_step))
    torch.testing.assert_close(out[1], mla(torch.cat((x[1:, 2:], step[1:]), 1))[0, -1:], rtol=1e-5, atol=1e-6)
    assert cache.lengths.tolist() == [6, 6]
