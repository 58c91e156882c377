"""A call plans once per value: the plan cache's hits, what makes a miss, and reasons as constant codes."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.attention import make_problem
from multihead.backends import BUILTIN
from multihead.backends.banded import TOO_FEW_KEYS, min_keys
from multihead.backends.decode.backend import MIN_KEYS as DECODE_MIN_KEYS
from multihead.backends.dispatch import PLAN_LIMIT, cache_info, plan_call, register_backend, remove_backend


def _qkv(B=2, H=2, L=6, D=8, Lk=None):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, L, D, generator=g), torch.randn(B, H, Lk or L, D, generator=g),
            torch.randn(B, H, Lk or L, D, generator=g))


def misses(fn) -> int:
    """How many plans `fn()` made (calls checked, folded and planned afresh)."""
    before = cache_info().misses
    fn()
    return cache_info().misses - before


def test_a_repeated_call_plans_once_and_mh_dispatch_does_not_evict_it():
    q, k, v = _qkv()
    mask = mh.Mask.key_padding(torch.tensor([[False] * 5 + [True]] * 2))
    assert misses(lambda: mh.attention(q, k, v, mask)) == 1
    assert misses(lambda: [mh.attention(q, k, v, mask) for _ in range(3)]) == 0
    assert misses(lambda: mh.dispatch(q, k, v, mask)) == 0
    assert misses(lambda: mh.attention(q, k, v, mask)) == 0


def test_masks_equal_by_value_share_a_plan():
    """Built afresh on every call, as a module's forward builds them: the same value, the same plan."""
    q, k, v = _qkv(L=8)
    pad = torch.zeros(2, 8, dtype=torch.bool)
    slopes = mh.alibi_slopes(2)
    for build in (lambda: mh.Mask.window(3) & mh.Mask.causal(), lambda: mh.Mask.chunks(4),
                  lambda: mh.Mask.alibi(slopes), lambda: mh.Mask.key_padding(pad)):
        mh.attention(q, k, v, build())
        assert misses(lambda: mh.attention(q, k, v, build())) == 0


def test_module_forwards_with_window_chunks_or_alibi_hit_the_plan():
    x = torch.randn(1, 8, 64)
    for options in ({"window": 16}, {"chunk_size": 4}, {"alibi": True}):
        attn = mh.MultiHeadAttention(64, 8, **options).eval()
        with torch.no_grad():
            attn(x)
            assert misses(lambda: [attn(x) for _ in range(3)]) == 0, options


def test_a_kv_cache_step_at_a_length_seen_before_hits_the_plan():
    attn = mh.MultiHeadAttention(64, 8, window=16).eval()
    cache = attn.new_cache(2, 300)
    token = torch.randn(2, 1, 64)
    with torch.no_grad():
        attn(torch.randn(2, 200, 64), cache=cache)
        step = attn(token, cache=cache)

        def again():
            cache.lengths.fill_(200)
            cache._filled = 200
            return attn(token, cache=cache)

        assert misses(lambda: [torch.testing.assert_close(again(), step) for _ in range(3)]) == 0


def test_an_edit_in_place_of_a_mask_tensor_is_seen():
    q, k, v = _qkv()
    lens = torch.tensor([6, 6])
    mask = mh.Mask.lengths(lens)
    mh.attention(q, k, v, mask)
    lens[0] = 2  # a new version: planned again, with the new lengths
    expected = mh.attention(q, k, v, mh.Mask.lengths(torch.tensor([2, 6])), backend="math")
    torch.testing.assert_close(mh.attention(q, k, v, mask), expected)


def test_a_mask_function_reading_a_tensor_the_mask_cannot_see_is_evaluated_on_every_call():
    q, k, v = _qkv()
    table = torch.ones(6, 6, dtype=torch.bool)
    mask = mh.Mask.mask_mod(lambda b, h, i, j: table[i, j])
    mh.attention(q, k, v, mask)
    table.fill_(False)
    table[:, 0] = True  # only key 0 now
    out = mh.attention(q, k, v, mask)
    torch.testing.assert_close(out, v[:, :, :1].expand_as(out))


def test_learnable_mask_tensors_get_a_fresh_graph_on_every_call():
    q, k, v = _qkv()
    offsets = torch.zeros(6, 6, requires_grad=True)
    mask = mh.Mask.additive(offsets)
    for _ in range(2):  # the second call must not reuse the first call's (freed) graph
        mh.attention(q, k, v, mask).sum().backward()
    assert offsets.grad is not None and torch.isfinite(offsets.grad).all()


def test_inference_tensors_in_a_mask_are_never_remembered_yet_give_the_right_answer():
    q, k, v = _qkv()
    with torch.inference_mode():
        lens = torch.tensor([3, 6])
        mask = mh.Mask.lengths(lens)
        first = mh.attention(q, k, v, mask)
        lens[0] = 1  # no version counter on an inference tensor: nothing may be remembered
        second = mh.attention(q, k, v, mask)
    torch.testing.assert_close(second, mh.attention(q, k, v, mh.Mask.lengths(torch.tensor([1, 6]))))
    assert not torch.equal(first, second)


def test_the_cache_holds_at_most_its_limit():
    q, k, v = _qkv()
    for size in range(1, PLAN_LIMIT + 10):
        mh.attention(q, k, v, mh.Mask.window(size))
    assert cache_info().size <= PLAN_LIMIT


def test_a_reused_mask_is_checked_once_per_size_and_still_refuses_a_wrong_one(monkeypatch):
    q, k, v = _qkv()
    mask = mh.Mask.key_padding(torch.zeros(2, 6, dtype=torch.bool))
    mh.attention(q, k, v, mask)
    monkeypatch.setattr(type(mask.parts[0]), "check", lambda *a: (_ for _ in ()).throw(AssertionError("again")))
    mh.attention(q, k, v, mask)  # the same sizes: not checked again
    with pytest.raises(AssertionError, match="again"):
        mh.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], mask)  # new sizes: checked


def test_causal_true_on_a_reused_mask_plans_once_and_equals_the_combined_mask():
    q, k, v = _qkv()
    mask = mh.Mask.key_padding(torch.tensor([[False] * 5 + [True]] * 2))
    keep = torch.ones(6, 6, dtype=torch.bool).tril() & (torch.arange(6) < 5)
    expected = mh.attention(q, k, v, mh.Mask.keep(keep))
    torch.testing.assert_close(mh.attention(q, k, v, mask, causal=True), expected)
    assert misses(lambda: torch.testing.assert_close(mh.attention(q, k, v, mask, causal=True), expected)) == 0


def test_varlen_reads_the_lengths_once_per_plan():
    q, k, v = _qkv(B=4, L=64, D=64)
    mask = mh.Mask.lengths(torch.tensor([3, 64, 10, 7]))
    out = mh.attention(q, k, v, mask, backend="varlen")
    problem, chosen, plan = plan_call(q, k, v, mask, False, None, None, None, 0.0, "varlen")
    assert chosen.name == "varlen" and [s[4] for s in plan.slices] == [3, 64, 10, 7]
    torch.testing.assert_close(out, mh.attention(q, k, v, mask, backend="math"), atol=1e-5, rtol=1e-5)


def test_plans_return_constant_reason_codes_that_dispatch_words():
    q, k, v = _qkv()
    problem = make_problem(q, k, v, mh.Mask.window(2), False, None, 0.0)
    banded = next(b for b in BUILTIN if b.name == "banded")
    assert banded.plan(problem, True) is TOO_FEW_KEYS  # the same object every call: nothing formatted
    decision = mh.dispatch(q, k, v, mh.Mask.window(2))
    assert decision.codes["banded"] == "banded.too-few-keys"
    assert f"fewer than {min_keys('cpu')} keys" in decision.reasons["banded"]


def test_plan_call_returns_the_backend_and_the_plan_it_runs():
    q, k, v = _qkv()
    problem, chosen, plan = plan_call(q, k, v, None, True, None, None, None, 0.0, "auto")
    assert chosen.name == "sdpa" and plan.is_causal and problem.form.causal


def _decode_call(H=3, D=24, max_len=200):
    """One query row per sequence against growing prefixes of a cache (shapes no other test here uses)."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, 1, D, generator=g)
    keys, values = torch.randn(1, H, max_len, D, generator=g), torch.randn(1, H, max_len, D, generator=g)
    window = lambda: mh.Mask.window(16, "bottom_right") & mh.Mask.causal("bottom_right")  # noqa: E731 (built per step)
    return lambda n, **kw: plan_call(q, keys[:, :, :n], values[:, :, :n], window(), False, None, None, None, 0.0,
                                     kw.get("backend", "auto"))


def test_decode_steps_over_a_growing_cache_plan_once():
    attn = mh.MultiHeadAttention(48, 4, window=16).eval()
    cache = attn.new_cache(1, 300)
    with torch.no_grad():
        attn(torch.randn(1, 100, 48), cache=cache)
        before = cache_info()
        steps = [attn(torch.randn(1, 1, 48), cache=cache) for _ in range(20)]  # 100 ... 119 keys: all decode's
        after = cache_info()
    assert (after.misses - before.misses, after.new_key_lengths - before.new_key_lengths) == (1, 0)
    assert after.hits - before.hits == 19 and all(s.shape == (1, 1, 48) for s in steps)


def test_a_growing_cache_changes_backend_at_the_threshold_and_back():
    """Across the decode step's MIN_KEYS, in either direction, the remembered plan never outlives its choice."""
    call = _decode_call()
    for n in [*range(DECODE_MIN_KEYS - 4, DECODE_MIN_KEYS + 4), DECODE_MIN_KEYS - 10, 150, DECODE_MIN_KEYS - 1]:
        problem, chosen, plan = call(n)
        assert chosen.name == ("decode" if n >= DECODE_MIN_KEYS else "sdpa"), n
        expected = mh.attention(problem.q, problem.k, problem.v, mh.Mask.window(16, "bottom_right")
                                & mh.Mask.causal("bottom_right"), backend="math")
        torch.testing.assert_close(chosen.run(problem, plan), expected, atol=1e-5, rtol=1e-5)
    _, chosen, _ = call(10, backend="decode")  # asked for by name: any length
    assert chosen.name == "decode"


class _LongOnly:
    """A backend tried before decode that takes only calls of at least 120 keys (reference math inside)."""

    name = "long-only"
    math = BUILTIN[-1]

    def plan(self, p, auto=True):
        return self.math.plan(p, False) if p.dims[3] >= 120 else TOO_FEW_KEYS

    def run(self, p, plan):
        return self.math.run(p, plan)

    def describe(self, p, plan):
        return "reference math from 120 keys"


def test_a_backend_tried_before_decode_takes_over_as_the_cache_grows():
    register_backend(_LongOnly(), before="decode")
    try:
        call = _decode_call()
        chosen = [call(n)[1].name for n in range(110, 130)]
    finally:
        remove_backend("long-only")
    assert chosen == ["decode"] * 10 + ["long-only"] * 10
