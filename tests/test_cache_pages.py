"""Paged caches: decoding through pages equals the full causal forward, fork shares pages (copy on write),
sequences come and go mid-run, beam search reorders block tables, and refused calls change nothing."""
from __future__ import annotations

import copy

import pytest
import torch

import multihead as mh
from multihead.caches.cascade import cascade_attention
from multihead.caches.pages import materialized

E, H, HKV = 64, 4, 2
TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}  # measured: fp32 ~3e-6, bf16 ~1e-2 of the largest output


def _module(dtype=torch.float32, **options):
    torch.manual_seed(0)
    return mh.MultiHeadAttention(E, H, num_kv_heads=HKV, causal=True, rope=mh.RoPE(E // H), **options).to(dtype).eval()


def _reference(m, x):
    """The full causal forward in float64: (B, L, E)."""
    with torch.no_grad():
        return copy.deepcopy(m).double()(x.double())


def _decode(m, cache, x, prompt: int):
    with torch.no_grad():
        return torch.cat([m(x[:, :prompt], cache=cache)] + [m(x[:, t:t + 1], cache=cache)
                                                           for t in range(prompt, x.shape[1])], 1)


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_paged_decoding_equals_the_full_forward_row_by_row(page_size, dtype):
    """2048 + 8 keys (the decode step engages), every row against float64."""
    m = _module(dtype)
    x = torch.randn(2, 2056, E, generator=torch.Generator().manual_seed(1)).to(dtype)
    cache = m.new_cache(2, 2056, page_size=page_size)
    got = _decode(m, cache, x, 2048)
    want = _reference(m, x)
    assert (got.double() - want).abs().max() <= TOL[dtype] * want.abs().max()
    assert cache.pages_in_use() == 2 * -(-2056 // page_size) and cache.block_table.shape == (2, -(-2056 // page_size))


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_quantized_pages_hold_the_contiguous_cache_codes(kv_dtype):
    m = _module()
    x = torch.randn(2, 40, E, generator=torch.Generator().manual_seed(2))
    paged, flat = m.new_cache(2, 48, kv_dtype=kv_dtype, page_size=16), m.new_cache(2, 48, kv_dtype=kv_dtype)
    got, want = _decode(m, paged, x, 30), _decode(m, flat, x, 30)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    codes = paged.read(paged.parts[0])
    assert torch.equal(codes.codes, flat.keys[:, :, :40]) and torch.equal(codes.scales, flat.key_scales[:, :, :40])
    assert paged.key_scales.shape == (6, HKV, 16) and paged.key_pages.dtype == flat.keys.dtype


def test_fork_shares_pages_and_copies_the_partial_page_on_write():
    m = _module()
    x = torch.randn(1, 30, E, generator=torch.Generator().manual_seed(3))
    cache = m.new_cache(3, 64, page_size=16)
    with torch.no_grad():
        m(torch.cat([x[:, :21], torch.zeros(2, 21, E)]), cache=cache,
          mask=mh.Mask.lengths(torch.tensor([21, 0, 0]), query_lens=torch.tensor([21, 0, 0])))
    one = cache.memory_bytes()
    cache.fork(0, 1)
    cache.fork(0, 2, length=10)
    assert cache.lengths.tolist() == [21, 21, 10] and cache.memory_bytes() == one  # nothing copied yet
    assert cache.page_refs()[cache.block_table[0]].tolist() == [3, 2, 0, 0][:cache.block_table.shape[1]]
    nxt = torch.randn(3, 1, E, generator=torch.Generator().manual_seed(4))
    shared = int(cache.block_table[0, 1])
    with torch.no_grad():
        got = m(nxt, cache=cache)  # each writes into a shared partial page: each gets its own copy
    refs = cache.page_refs()
    assert refs[cache.block_table[0, 0]] == 2 and refs[cache.block_table[2, 0]] == 1  # page 0 copied for seq 2
    assert int(cache.block_table[0, 1]) != shared == int(cache.block_table[1, 1])  # the last holder writes in place
    assert cache.pages_in_use() == 4
    for b, n in ((0, 21), (1, 21), (2, 10)):
        want = _reference(m, torch.cat([x[:, :n], nxt[b:b + 1]], 1))[:, -1]
        assert (got[b, 0].double() - want[0]).abs().max() < 1e-5


def test_sequences_come_and_go_while_others_decode():
    m = _module()
    xs = [torch.randn(1, 12, E, generator=torch.Generator().manual_seed(10 + b)) for b in range(4)]
    cache = m.new_cache(3, 32, page_size=4, num_pages=16)
    with torch.no_grad():
        m(torch.cat([x[:, :6] for x in xs[:3]]), cache=cache)
        cache.release(1)
        assert cache.lengths.tolist() == [6, 0, 6] and cache.pages_in_use() == 4
        b = cache.add_sequence()
        assert b == 1
        lens = torch.tensor([1, 5, 1])  # row 1 takes its 5-token prompt, the others one more token
        step = torch.zeros(3, 5, E)
        step[0, 0], step[1], step[2, 0] = xs[0][0, 6], xs[3][0, :5], xs[2][0, 6]
        out = m(step, cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
        assert cache.add_sequence() == 3 and cache.block_table.shape[0] == 4 and cache.lengths.tolist() == [7, 5, 7, 0]
    for row, x, n, q in ((0, xs[0], 7, 0), (1, xs[3], 5, 4), (2, xs[2], 7, 0)):
        want = _reference(m, x[:, :n])[0, -1]
        assert (out[row, q].double() - want).abs().max() < 1e-5


def test_reorder_moves_block_table_rows_for_beam_search():
    m = _module()
    x = torch.randn(3, 20, E, generator=torch.Generator().manual_seed(5))
    nxt = torch.randn(3, 1, E, generator=torch.Generator().manual_seed(6))
    index = torch.tensor([2, 2, 0])
    cache = m.new_cache(3, 32, page_size=16)
    with torch.no_grad():
        m(x, cache=cache)
        used = cache.pages_in_use()
        cache.reorder(index)
        assert cache.pages_in_use() == 4 < used  # beams 0 and 1 share old sequence 2's pages
        got = m(nxt, cache=cache)
    want = _reference(m, torch.cat([x[index], nxt], 1))[:, -1:]
    assert (got.double() - want).abs().max() < 1e-5


def _state(cache):
    return {n: t.clone() for n, t in cache.state_dict().items()}, cache.held


@pytest.mark.parametrize("bad, match", [
    (lambda m, c: m(torch.randn(2, 9, E), cache=c), "free pages"),
    (lambda m, c: m(torch.randn(2, 40, E), cache=c), "max_len=40"),
    (lambda m, c: m(torch.randn(3, 1, E), cache=c), "cache is for batch 2"),
    (lambda m, c: c.fork(0, 0), "two different sequences"),
    (lambda m, c: c.fork(0, 1, length=7), r"length in \[0, 6\]"),
    (lambda m, c: c.release(2), r"sequence index in \[0, 2\)"),
    (lambda m, c: c.reorder(torch.tensor([0, 5])), r"reorder indices must lie in \[0, 2\)"),
])
def test_refused_calls_leave_the_paged_cache_unchanged(bad, match):
    m = _module()
    cache = m.new_cache(2, 40, page_size=4, num_pages=4)
    with torch.no_grad():
        m(torch.randn(2, 6, E), cache=cache)
    before = _state(cache)
    with pytest.raises(mh.AttentionError, match=match), torch.no_grad():
        bad(m, cache)
    after = _state(cache)
    assert after[1] == before[1] and all(torch.equal(after[0][n], t) for n, t in before[0].items())


def test_memory_bytes_and_repr():
    m = _module()
    flat, paged = m.new_cache(2, 64), m.new_cache(2, 64, page_size=16, kv_dtype=torch.int8)
    assert flat.memory_bytes() == 2 * 2 * HKV * 64 * (E // H) * 4 and paged.memory_bytes() == 0
    with torch.no_grad():
        m(torch.randn(2, 17, E), cache=paged)
    assert paged.memory_bytes() == 4 * 16 * HKV * (2 * (E // H) + 2 * 4)  # 4 pages: codes and fp32 scales
    text = repr(paged)
    for shown in ("batch_size=2", "heads=2", "max_len=64", "dtype=torch.float32", "codec=int8", "page_size=16",
                  "pages=4/8", "lengths=[17, 17]"):
        assert shown in text


@pytest.mark.parametrize("dtype, kv_dtype", [(torch.float32, None), (torch.bfloat16, None),
                                            (torch.float32, torch.int8), (torch.bfloat16, torch.float8_e4m3fn)],
                         ids=["fp32", "bf16", "int8", "fp8"])
@pytest.mark.parametrize("scattered", [False, True], ids=["one-run", "scattered"])
def test_cascade_reads_the_shared_prefix_once_and_equals_plain_attention(dtype, kv_dtype, scattered):
    """4 sequences share a 2048-token prefix, each with its own suffix; against float64 attention over the
    numbers the cache holds. The prefix's pages are one run of the pool, or (written a page at a time to every
    sequence, then forked) every 4th page."""
    B, P, D = 4, 2048, 32
    g = torch.Generator().manual_seed(7)
    cache = mh.KVCache(B, P + 40, HKV, D, page_size=16, dtype=dtype, kv_dtype=kv_dtype)
    pk, pv = (torch.randn(1, HKV, P, D, generator=g).to(dtype) for _ in range(2))
    chunks = range(0, P, 16) if scattered else [0]
    for start in chunks:
        end = start + 16 if scattered else P
        cache.append(pk[..., start:end, :].expand(B, -1, -1, -1).contiguous(),
                     pv[..., start:end, :].expand(B, -1, -1, -1).contiguous(),
                     None if scattered else torch.tensor([P, 0, 0, 0]))
    for b in range(1, B):
        cache.fork(0, b)
    pages = cache.block_table[0, :P // 16]
    assert bool((pages.diff() != 1).any()) == scattered
    lens = torch.tensor([5, 17, 1, 30])
    sk, sv = (torch.randn(B, HKV, 30, D, generator=g).to(dtype) for _ in range(2))
    keys, values = (materialized(t) for t in cache.append(sk, sv, lens)[:2])  # the pages gathered
    if kv_dtype is not None:
        keys, values = keys.numbers(torch.float64), values.numbers(torch.float64)
    q = torch.randn(B, H, 1, D, generator=g).to(dtype)
    got = cascade_attention(q, cache, prefix=P)
    assert cache.pages_in_use() == P // 16 + sum(-(-int(n) // 16) for n in lens)
    for b in range(B):
        k = keys[b:b + 1, :, :P + int(lens[b])].double().repeat_interleave(H // HKV, 1)
        v = values[b:b + 1, :, :P + int(lens[b])].double().repeat_interleave(H // HKV, 1)
        want = torch.softmax(q[b:b + 1].double() @ k.transpose(-1, -2) / D ** 0.5, -1) @ v
        assert (got[b:b + 1].double() - want).abs().max() <= TOL[dtype] * want.abs().max()


def test_cascade_refuses_a_query_that_wants_a_gradient_and_leaves_the_cache_alone():
    cache = mh.KVCache(2, 64, HKV, 8, page_size=16)
    cache.append(torch.randn(2, HKV, 16, 8), torch.randn(2, HKV, 16, 8), torch.tensor([16, 0]))
    cache.fork(0, 1)
    cache.append(torch.randn(2, HKV, 2, 8), torch.randn(2, HKV, 2, 8))
    before = (cache.block_table.clone(), cache.lengths.clone())
    q = torch.randn(2, H, 1, 8, requires_grad=True)
    with pytest.raises(mh.AttentionError, match="keeps no gradient"):
        cascade_attention(q, cache, prefix=16)
    assert torch.equal(cache.block_table, before[0]) and torch.equal(cache.lengths, before[1])
    with torch.no_grad():
        assert cascade_attention(q, cache, prefix=16).shape == (2, H, 1, 8)


def test_a_ragged_decode_step_hands_one_mask_object_across_steps():
    """The plan cache can hold across steps: the step's mask is one object over a lengths tensor kept in place."""
    m = _module()
    cache = m.new_cache(2, 16, page_size=4)
    with torch.no_grad():
        lens = torch.tensor([3, 5])
        m(torch.randn(2, 5, E), cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
        masks = [cache.append(*(torch.randn(2, HKV, 1, E // H) for _ in range(2)))[2] for _ in range(3)]
    assert masks[0] is masks[1] is masks[2] and cache.lengths.tolist() == [6, 8]
    assert masks[2].parts[0].key_lens.tolist() == [6, 8]
    for mode in (torch.inference_mode, torch.no_grad, torch.inference_mode):  # the kept lengths move in each
        with mode():
            m(torch.randn(2, 1, E), cache=cache)
    assert masks[0].parts[0].key_lens.tolist() == [9, 11]


@pytest.mark.parametrize("kv_dtype", [None, torch.int8], ids=["float", "int8"])
def test_a_paged_latent_cache_decodes_like_the_contiguous_one(kv_dtype):
    """The latent layout gets pages from the same base: MLA's decode over pages equals it over slots."""
    from test_latent import make_mla

    mla = make_mla(E=E).eval()
    x = torch.randn(2, 21, E, generator=torch.Generator().manual_seed(8))
    paged, flat = (mla.new_cache(2, 32, kv_dtype=kv_dtype, page_size=s) for s in (8, None))
    got, want = (_decode(mla, c, x, 17) for c in (paged, flat))
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    assert paged.latent_pages.shape[1:] == (1, 8, 16 + 4) and paged.pages_in_use() == 6
    grown = paged.resized(torch.tensor([1, 0]))  # contiguous again, read through the pages
    assert torch.equal(grown.keys[0, :, :21], flat.keys[1, :, :21])


def test_the_v4_cache_refuses_pages_codes_and_per_sequence_operations():
    """DeepSeek V4's window cache keeps every sequence at one length: no pages, no int8, no fork or release."""
    from multihead.caches.new import new_cache
    from multihead.caches.shared_kv import SharedKVCache

    weight = torch.zeros(4, 4)
    for options in ({"page_size": 16}, {"kv_dtype": torch.int8}):
        with pytest.raises(mh.AttentionError, match="takes no int8/fp8 kv_dtype, page_size"):
            new_cache(SharedKVCache, weight, 2, 8, head_dim=16, window=4, **options)
    cache = new_cache(SharedKVCache, weight, 2, 8, head_dim=16, window=4, kv_dtype=torch.bfloat16)
    assert cache.window.dtype == torch.bfloat16 and "window=4" in repr(cache)
    for bad in (lambda: cache.fork(0, 1), lambda: cache.release(0), lambda: cache.add_sequence()):
        with pytest.raises(mh.AttentionError, match="SharedKVCache"):
            bad()


@pytest.mark.parametrize("kv_dtype", [None, torch.int8, torch.float8_e4m3fn], ids=["float", "int8", "fp8"])
def test_a_paged_decode_step_reads_the_pages_in_place(kv_dtype, monkeypatch):
    """After the prompt, each step goes to the paged decode op: no page is gathered, and the output is the
    contiguous cache's."""
    m = _module(sinks=True, softcap=30.0)
    x = torch.randn(2, 40, E, generator=torch.Generator().manual_seed(9))
    paged, flat = m.new_cache(2, 48, kv_dtype=kv_dtype, page_size=16), m.new_cache(2, 48, kv_dtype=kv_dtype)
    with torch.no_grad():
        m(x[:, :30], cache=paged), m(x[:, :30], cache=flat)
        monkeypatch.setattr(type(paged), "_gathered", lambda *a: pytest.fail("a decode step gathered pages"))
        got = torch.cat([m(x[:, t:t + 1], cache=paged) for t in range(30, 40)], 1)
        want = torch.cat([m(x[:, t:t + 1], cache=flat) for t in range(30, 40)], 1)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)


def test_a_contiguous_cache_takes_release_add_sequence_and_fork_too():
    m = _module()
    x = torch.randn(3, 8, E, generator=torch.Generator().manual_seed(11))
    cache = m.new_cache(2, 16)
    with torch.no_grad():
        m(x[:2, :5], cache=cache)
        cache.release(1)
        assert (cache.add_sequence(), cache.add_sequence()) == (1, 2) and cache.keys.shape[0] == 3
        lens = torch.tensor([1, 5, 5])
        step = torch.zeros(3, 5, E)
        step[0, 0], step[1], step[2] = x[0, 5], x[1, :5], x[2, :5]
        out = m(step, cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
        cache.fork(2, 0, length=3)
    for row, n, q in ((0, 6, 0), (1, 5, 4), (2, 5, 4)):
        assert (out[row, q].double() - _reference(m, x[row:row + 1, :n])[0, -1]).abs().max() < 1e-5
    assert cache.lengths.tolist() == [3, 5, 5] and torch.equal(cache.keys[0, :, :3], cache.keys[2, :, :3])
    assert not cache.keys[0, :, 3:].any()  # the rest of the row is emptied
    with pytest.raises(mh.AttentionError, match="contiguous"):
        cache.page_refs()
