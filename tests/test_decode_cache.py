"""KVCache: incremental decoding equals the full causal forward, row by row, and bad use changes nothing."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.testing import CompileCounter

import multihead as mh

E, H = 32, 4


def _module(seed=0, **options):
    torch.manual_seed(seed)
    m = mh.MultiHeadAttention(E, H, causal=True, **options).eval()
    if m.sinks is not None:
        torch.nn.init.normal_(m.sinks)
    return m


def _decode(m, x, chunks, lens=None):
    """Prefill x[:, :chunks[0]] then feed the rest chunk by chunk; the outputs, concatenated."""
    cache = m.new_cache(x.shape[0], x.shape[1] + 2)
    outs, start = [], 0
    for size in chunks:
        outs.append(m(x[:, start:start + size], cache=cache))
        start += size
    return torch.cat(outs, 1), cache


VARIANTS = {
    "plain": {},
    "gqa": {"num_kv_heads": 2},
    "mqa": {"num_kv_heads": 1},
    "window": {"window": 3},
    "alibi": {"alibi": True},
    "softcap": {"softcap": 2.0},
    "sinks": {"sinks": True},
    "qk-norm": {"qk_norm": True},
    "rope": {"rope": mh.RoPE(E // H)},
    "rope-gptj-partial": {"rope": mh.RoPE(E // H, interleaved=True, rotary_dim=4)},
    "everything": {"num_kv_heads": 2, "window": 4, "softcap": 3.0, "sinks": True, "qk_norm": True,
                   "rope": mh.RoPE(E // H, base=500.0)},
}


@settings(max_examples=30, deadline=None)
@given(variant=st.sampled_from(sorted(VARIANTS)), L=st.integers(2, 12), B=st.integers(1, 3),
       data=st.data())
def test_incremental_equals_full_row_by_row(variant, L, B, data):
    """Any split into a prefill and steps of 1 to 3 tokens (speculative decoding) gives the full forward's rows."""
    chunks, left = [], L
    while left:
        size = data.draw(st.integers(1, min(left, 3 if chunks else left)))
        chunks.append(size)
        left -= size
    m = _module(**VARIANTS[variant])
    x = torch.randn(B, L, E, generator=torch.Generator().manual_seed(L))
    with torch.no_grad():
        got, cache = _decode(m, x, chunks)
        torch.testing.assert_close(got, m(x), atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == [L] * B


@pytest.mark.parametrize("variant", ["plain", "gqa", "window", "alibi", "sinks", "rope"])
def test_ragged_prefill_then_decode_per_sequence(variant):
    """A right-padded prompt batch prefilled with Mask.lengths advances each sequence by its own length."""
    m = _module(**VARIANTS[variant])
    lens = torch.tensor([5, 2, 4])
    x = torch.randn(3, 8, E, generator=torch.Generator().manual_seed(1))
    cache = m.new_cache(3, 10)
    with torch.no_grad():
        first = m(x[:, :5], cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
        assert cache.lengths.tolist() == [5, 2, 4]
        steps = [m(x[:, 5 + t:6 + t], cache=cache) for t in range(3)]  # (B, 1, E) each
        for b, n in enumerate(lens.tolist()):
            seq = torch.cat([x[b, :n], x[b, 5:8]])[None]  # the sequence without its padding
            full = m(seq)[0]
            torch.testing.assert_close(first[b, :n], full[:n], atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(torch.cat(steps, 1)[b], full[n:], atol=1e-5, rtol=1e-5)
    assert cache.lengths.tolist() == [8, 5, 7]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_incremental_drifts_no_more_than_twice_the_full_forward(dtype):
    m64 = _module(num_kv_heads=2, window=4).double()
    x = torch.randn(2, 10, E, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        exact = m64(x)
        m = _module(num_kv_heads=2, window=4).to(dtype)
        full_err = (m(x.to(dtype)).double() - exact).abs().max().item()
        inc, _ = _decode(m, x.to(dtype), [4, 1, 1, 2, 1, 1])
        inc_err = (inc.double() - exact).abs().max().item()
    assert inc_err <= 2 * full_err + torch.finfo(dtype).eps


def test_sliding_window_step_equals_full_with_a_long_history():
    m = _module(window=4)
    x = torch.randn(1, 20, E, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got, _ = _decode(m, x, [10] + [1] * 10)
        torch.testing.assert_close(got, m(x), atol=1e-5, rtol=1e-5)


# ---------------------------------------------------------------- the cache object

def test_cache_holds_buffers_not_parameters_and_follows_the_module():
    m = _module(num_kv_heads=2)
    cache = m.new_cache(3, 16)
    assert list(cache.parameters()) == []
    assert {name for name, _ in cache.named_buffers()} == {"keys", "values", "lengths"}
    assert cache.keys.shape == (3, 2, 16, E // H) and cache.lengths.dtype == torch.long
    assert cache.keys.dtype == m.k_proj.weight.dtype


def test_reset_empties_every_sequence():
    m = _module()
    x = torch.randn(2, 6, E)
    with torch.no_grad():
        _, cache = _decode(m, x, [6])
        cache.reset()
        assert cache.lengths.tolist() == [0, 0] and not cache.keys.any()
        again, _ = _decode(m, x, [3, 3])
        torch.testing.assert_close(m(x[:, :3], cache=cache), again[:, :3], atol=1e-6, rtol=1e-6)


def test_reorder_for_beam_search():
    """After reorder(index), sequence b continues the history of old sequence index[b]."""
    m = _module(num_kv_heads=2)
    x = torch.randn(3, 6, E, generator=torch.Generator().manual_seed(4))
    nxt = torch.randn(3, 1, E, generator=torch.Generator().manual_seed(5))
    index = torch.tensor([2, 2, 0])
    with torch.no_grad():
        _, cache = _decode(m, x, [6])
        cache.reorder(index)
        got = m(nxt, cache=cache)
        want = m(torch.cat([x[index], nxt], 1))[:, -1:]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _snapshot(cache):
    return [t.clone() for t in (cache.keys, cache.values, cache.lengths)]


@pytest.mark.parametrize("bad, match", [
    (lambda m, c: m(torch.randn(2, 5, E), cache=c), "max_len=8"),
    (lambda m, c: m(torch.randn(3, 1, E), cache=c), "cache is for batch 2"),
    (lambda m, c: _module(num_kv_heads=1)(torch.randn(2, 1, E), cache=c), "2 kv heads"),
    (lambda m, c: m.double()(torch.randn(2, 1, E, dtype=torch.float64), cache=c), "cache holds torch.float32"),
    (lambda m, c: m(torch.randn(2, 1, E), torch.randn(2, 3, E), cache=c), "self-attention"),
    (lambda m, c: m(torch.randn(2, 1, E), cache=c, mask=mh.Mask.causal()), "mask may only be Mask.lengths"),
    (lambda m, c: m(torch.randn(2, 1, E), cache=object()), "cache must be a KVCache"),
    (lambda m, c: c.reorder(torch.tensor([0, 5])), r"reorder indices must lie in \[0, 2\)"),
    (lambda m, c: c.reorder(torch.tensor([0.0, 1.0])), "integer tensor of shape"),
    (lambda m, c: m(torch.randn(2, 2, E), cache=c, mask=mh.Mask.lengths(torch.tensor([2, 3]))), r"lie in \[0, 2\]"),
])
def test_bad_use_raises_and_leaves_the_cache_unchanged(bad, match):
    m = _module(num_kv_heads=2)
    cache = m.new_cache(2, 8)
    with torch.no_grad():
        m(torch.randn(2, 4, E), cache=cache)
    before = _snapshot(cache)
    with pytest.raises(mh.AttentionError, match=match), torch.no_grad():
        bad(m, cache)
    for old, new in zip(before, _snapshot(cache)):
        assert torch.equal(old, new)


def test_compiled_decoding_never_recompiles():
    """256 decode steps under torch.compile(fullgraph=True): one graph for the prefill, one for the steps."""
    m = _module(num_kv_heads=2, window=16, alibi=True)
    cache = m.new_cache(2, 264)
    counter = CompileCounter()
    step = torch.compile(lambda x, c: m(x, cache=c), backend=counter, fullgraph=True)
    x = torch.randn(2, 264, E, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        outs = [step(x[:, :8], cache)] + [step(x[:, t:t + 1], cache) for t in range(8, 264)]
        torch.testing.assert_close(torch.cat(outs, 1), m(x), atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 2
