"""The sparse backend's decode step read in place by the C++ kernel: lists passed as they are when the other
terms keep every listed key (decided from the normal form), else -1 where a term blocks a slot; repeats and
-1 are skipped by the kernel. Each case against float64 attention over the distinct allowed keys."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
import multihead.backends.sparse as sparse_backend
from multihead.backends.problem import Problem
from multihead.masks import Mask

TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}
Lk, K, D = 300, 40, 32  # K > one block of listed rows (32 bf16, 64 fp32 rows where W = 16)


def _case(B, Lq, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, 8, Lq, D, generator=g).to(dtype)
    k, v = (torch.randn(B, 1, Lk, D, generator=g).to(dtype) for _ in range(2))
    idx = torch.randint(-1, Lk, (B, Lq, K), generator=g)
    idx[..., 1::2] = idx[..., 0::2]  # every key listed twice, side by side
    idx[..., -3:] = Lk - 1  # the last key, listed three times: cut for every query but the last one (causal)
    return q, k, v, idx


def _reference(q, k, v, idx, more):
    keep = torch.zeros(*idx.shape[:-1], Lk + 1, dtype=torch.bool)
    mask = Mask.keep(keep.scatter_(-1, torch.where(idx >= 0, idx, Lk), True)[..., :Lk][:, None])
    return mh.attention(q.double(), k.double(), v.double(), mask if more is None else mask & more, backend="math")


def _problem(mask, Lq):
    q, k, v = torch.zeros(1, 2, Lq, 4), torch.zeros(1, 1, Lk, 4), torch.zeros(1, 1, Lk, 4)
    return Problem(q, k, v, mask.normal_form(), 0.5, 0.0)


def test_keeps_every_listed_key_reads_the_form_and_shapes_only():
    lists = Mask.sparse(torch.zeros(1, 3, 2, dtype=torch.long))
    one = Mask.sparse(torch.zeros(1, 1, 2, dtype=torch.long))
    step = _problem(one & Mask.causal("bottom_right"), 1)
    assert sparse_backend.keeps_every_listed_key(step, 0, 1)  # a step at the end sees every key
    assert sparse_backend.keeps_every_listed_key(_problem(one, 1), 0, 1)  # the lists alone
    block = _problem(lists & Mask.causal("bottom_right"), 3)
    assert sparse_backend.keeps_every_listed_key(block, 2, 3) and not sparse_backend.keeps_every_listed_key(block, 0, 3)
    assert not sparse_backend.keeps_every_listed_key(_problem(one & Mask.causal(), 1), 0, 1)  # top-left: key 0 only
    assert not sparse_backend.keeps_every_listed_key(
        _problem(one & Mask.causal("bottom_right") & Mask.window(8, "bottom_right"), 1), 0, 1)
    assert not sparse_backend.keeps_every_listed_key(_problem(one & Mask.lengths(torch.tensor([Lk])), 1), 0, 1)


CASES = {  # (B, Lq, more terms, whether the other terms are evaluated at the listed keys)
    "bottom-right step": (2, 1, Mask.causal("bottom_right"), False),
    "lists alone": (2, 1, None, False),
    "bottom-right block of queries": (1, 3, Mask.causal("bottom_right"), True),
    "top-left step": (2, 1, Mask.causal(), True),
    "window step": (2, 1, Mask.causal("bottom_right") & Mask.window(100, "bottom_right"), True),
    "lengths that differ": (2, 1, Mask.causal("bottom_right") & Mask.lengths(torch.tensor([Lk, Lk - 60])), True),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(CASES))
def test_the_step_read_in_place_equals_float64(name, dtype, monkeypatch):
    B, Lq, more, evaluates = CASES[name]
    if sparse_backend.kernel() is None:
        pytest.skip("no decode build on this machine")
    q, k, v, idx = _case(B, Lq, dtype, seed=len(name))
    calls = {"in place": 0, "others": 0}
    for fn, key in ((sparse_backend._listed_in_place, "in place"), (sparse_backend._other_terms, "others")):
        monkeypatch.setattr(sparse_backend, fn.__name__,
                            lambda *a, fn=fn, key=key: calls.__setitem__(key, calls[key] + 1) or fn(*a))
    lists = Mask.sparse(idx.int() if dtype is torch.float32 else idx)  # int32 lists too
    mask = lists if more is None else lists & more
    with torch.inference_mode():
        out = mh.attention(q, k, v, mask, backend="sparse")
    assert calls["in place"] == 1 and (calls["others"] > 0) == evaluates
    torch.testing.assert_close(out.double(), _reference(q, k, v, idx, more), atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_compiled_step_with_repeats_and_free_slots_equals_float64(dtype):
    """Under torch.compile the rows are gathered by torch and compacted (the kernel's custom op runs over them)."""
    f = torch.compile(lambda q, k, v, idx: mh.attention(q, k, v, Mask.sparse(idx) & Mask.causal("bottom_right")),
                      dynamic=True, fullgraph=True, backend="eager")
    q, k, v, idx = _case(2, 1, dtype, seed=9)
    with torch.no_grad():
        out = f(q, k, v, idx)
    torch.testing.assert_close(out.double(), _reference(q, k, v, idx, Mask.causal("bottom_right")),
                               atol=TOL[dtype], rtol=0)
