"""Plans hold in real loops and never go stale.

A ragged decode loop (a new Mask.lengths tensor each step, lengths that change, a key more each step) and a
decoder's fresh top-k lists (a new Mask.sparse index tensor each step at a fixed K) plan once over 50 steps:
(misses, re-choices) = (1, 0), every step equal to float64 reference math. A plan built from a mask tensor's
values never outlives a change to them, however it is written: in place, through .numpy(), through .data.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends import dispatch
from multihead.backends.dispatch import cache_info

STEPS = 50


@pytest.fixture(autouse=True)
def no_plans_yet():
    """Each loop starts with no plan remembered (another test may have met the same shapes)."""
    dispatch._PLANS.clear()
    dispatch._KEY_LENGTHS.clear()


def _counts() -> tuple[int, int]:
    info = cache_info()
    return info.misses, info.new_key_lengths


def _check(out, q, k, v, mask, tol=1e-5):
    ref = mh.attention(q.double(), k.double(), v.double(), mask, backend="math")
    assert (out.double() - ref).abs().max().item() <= tol * max(1.0, ref.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_ragged_decode_loop_plans_once_over_50_steps(dtype):
    g = torch.Generator().manual_seed(0)
    B, H, Hkv, D, M = 3, 4, 2, 16, 2300
    keys, values = (torch.randn(B, Hkv, M, D, generator=g).to(dtype) for _ in range(2))
    lengths = torch.tensor([2100, 1500, 1990])
    calls = []
    with torch.inference_mode():
        before = _counts()
        for t in range(STEPS):
            lengths = lengths + torch.tensor([1, t % 2, 1])  # a sequence that pauses every other step
            Lk = 2100 + t + 1
            mask = mh.Mask.lengths(lengths.clone()) & mh.Mask.causal("bottom_right")  # as a ragged cache makes it
            q = torch.randn(B, H, 1, D, generator=g).to(dtype)
            out = mh.attention(q, keys[:, :, :Lk], values[:, :, :Lk], mask)
            calls.append((out, q, keys[:, :, :Lk], values[:, :, :Lk], mask))
        after = _counts()
        assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
        assert mh.dispatch(*calls[-1][1:]).backend == "decode"
        for out, q, k, v, mask in calls:
            _check(out, q, k, v, mask, 1e-5 if dtype is torch.float32 else 2e-2)


def test_fresh_top_k_lists_at_a_fixed_k_plan_once_over_50_steps():
    g = torch.Generator().manual_seed(1)
    B, H, Hkv, D, K, M = 2, 4, 1, 16, 64, 2200
    keys, values = (torch.randn(B, Hkv, M, D, generator=g) for _ in range(2))
    calls = []
    with torch.no_grad():
        before = _counts()
        for t in range(STEPS):
            Lk = 2100 + t
            lists = torch.randint(-1, Lk, (B, 1, K), generator=g)  # a new index tensor every step, -1 = none
            mask = mh.Mask.sparse(lists)
            q = torch.randn(B, H, 1, D, generator=g)
            calls.append((mh.attention(q, keys[:, :, :Lk], values[:, :, :Lk], mask), q, keys[:, :, :Lk],
                          values[:, :, :Lk], mask))
        after = _counts()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
    assert mh.dispatch(*calls[-1][1:]).backend == "sparse"
    for out, q, k, v, mask in calls:
        _check(out, q, k, v, mask)


def _written(t: torch.Tensor, i, x) -> torch.Tensor:
    new = t.clone()
    new[i] = x
    return new


WRITES = {
    "in place": lambda t, i, x: t.__setitem__(i, x),
    "through .numpy()": lambda t, i, x: t.numpy().__setitem__(i, x),
    "through .data": lambda t, i, x: t.data.__setitem__(i, x),
    "copy_": lambda t, i, x: t.copy_(_written(t, i, x)),
}


@pytest.mark.parametrize("write", list(WRITES))
@pytest.mark.parametrize("case", ["lengths, sdpa", "lengths, varlen", "lengths, decode", "key padding",
                                  "sparse lists"])
def test_a_plan_never_outlives_a_change_to_the_values_it_was_built_from(case, write):
    """The same mask object, called, written to, called again: the second call sees the new values."""
    g = torch.Generator().manual_seed(2)
    B, H, D = 2, 2, 8
    Lq, Lk = {"lengths, decode": (1, 2100), "lengths, varlen": (600, 600)}.get(case, (6, 6))
    q = torch.randn(B, H, Lq, D, generator=g)
    k, v = torch.randn(B, H, Lk, D, generator=g), torch.randn(B, H, Lk, D, generator=g)
    if case.startswith("lengths"):
        t = torch.tensor([Lk, Lk // 2])
        mask, index, value = mh.Mask.lengths(t), 0, Lk // 3
    elif case == "key padding":
        t = torch.zeros(B, Lk, dtype=torch.bool)
        mask, index, value = mh.Mask.key_padding(t), (0, 1), True
    else:
        t = torch.tensor([[[0, 2, 4]], [[1, 3, 5]]]).expand(B, Lq, 3).contiguous()
        mask, index, value = mh.Mask.sparse(t), (0, 0, 1), 5
    backend = case.split(", ")[1] if ", " in case else "auto"
    with torch.no_grad():
        first = mh.attention(q, k, v, mask, backend=backend)
        _check(first, q, k, v, mask)
        WRITES[write](t, index, value)
        second = mh.attention(q, k, v, mask, backend=backend)
    _check(second, q, k, v, mask)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("kv_dtype", [None, torch.int8], ids=["float", "int8"])
def test_a_paged_decode_loop_whose_block_table_changes_plans_once_over_50_steps(kv_dtype):
    """A ragged paged cache (pages of 16): 50 steps, the block table gaining pages as sequences cross page ends;
    the pages are read in place (the paged backend) and every step equals the contiguous cache's."""
    torch.manual_seed(4)
    m = mh.MultiHeadAttention(64, 4, num_kv_heads=2, causal=True).eval()
    paged, flat = (m.new_cache(2, 2300, page_size=16, kv_dtype=kv_dtype), m.new_cache(2, 2300, kv_dtype=kv_dtype))
    prompt, lens = torch.randn(2, 2100, 64), torch.tensor([2100, 1500])
    with torch.no_grad():
        for cache in (paged, flat):
            m(prompt, cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
        tables, outs = [], []
        before = _counts()
        for t in range(STEPS):
            x = torch.randn(2, 1, 64)
            outs.append((m(x, cache=paged), x))
            tables.append(paged.block_table.clone())
        after = _counts()
        assert (after[0] - before[0], after[1] - before[1]) == (1, 0)
        assert not torch.equal(tables[0], tables[-1])  # pages were added along the way
        q = torch.randn(2, 4, 1, 16)
        k, v, mask = paged.append(torch.randn(2, 2, 1, 16), torch.randn(2, 2, 1, 16))
        assert mh.dispatch(q, k, v, mask).backend == "paged"
        for out, x in outs:
            torch.testing.assert_close(out, m(x, cache=flat), atol=1e-5, rtol=1e-5)
