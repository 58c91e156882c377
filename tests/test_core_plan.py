"""A call decides once: one plan per call, reasons as constant codes worded only by mh.dispatch."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends import BACKENDS
from multihead.backends.banded import TOO_FEW_KEYS, min_keys
from multihead.dispatch import pick
from multihead.masks.lengths import LengthsPart
from multihead.attention import make_problem


def _qkv(B=2, H=2, L=6, D=8):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, L, D, generator=g) for _ in range(3))


def test_varlen_reads_the_lengths_once_per_call(monkeypatch):
    q, k, v = _qkv(B=4, L=64, D=64)
    reads = []
    original = LengthsPart.slices
    monkeypatch.setattr(LengthsPart, "slices", lambda self, Lq, Lk: reads.append(1) or original(self, Lq, Lk))
    mask = mh.Mask.lengths(torch.tensor([3, 64, 10, 7]))
    out = mh.attention(q, k, v, mask, backend="varlen")
    assert len(reads) == 1
    assert torch.allclose(out, mh.attention(q, k, v, mask, backend="math"), atol=1e-5)


def test_plans_return_constant_reason_codes_that_dispatch_words():
    q, k, v = _qkv()
    problem = make_problem(q, k, v, mh.Mask.window(2), False, None, 0.0)
    banded = next(b for b in BACKENDS if b.name == "banded")
    assert banded.plan(problem, True) is TOO_FEW_KEYS  # the same object every call: nothing formatted
    decision = mh.dispatch(q, k, v, mh.Mask.window(2))
    assert decision.codes["banded"] == "banded.too-few-keys"
    assert f"fewer than {min_keys('cpu')} keys" in decision.reasons["banded"]


def test_pick_returns_the_backend_and_the_plan_it_runs():
    q, k, v = _qkv()
    chosen, plan = pick(make_problem(q, k, v, None, True, None, 0.0))
    assert chosen.name == "sdpa" and plan.is_causal


def test_a_reused_mask_is_checked_once_per_size_and_still_refuses_a_wrong_one(monkeypatch):
    q, k, v = _qkv()
    mask = mh.Mask.key_padding(torch.zeros(2, 6, dtype=torch.bool))
    mh.attention(q, k, v, mask)
    monkeypatch.setattr(type(mask.parts[0]), "check", lambda *a: (_ for _ in ()).throw(AssertionError("again")))
    mh.attention(q, k, v, mask)  # the same sizes: not checked again
    with pytest.raises(AssertionError, match="again"):
        mh.attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], mask)  # new sizes: checked


def test_causal_true_on_a_reused_mask_reuses_one_combined_mask_and_its_plan():
    q, k, v = _qkv()
    mask = mh.Mask.key_padding(torch.tensor([[False] * 5 + [True]] * 2))
    first = make_problem(q, k, v, mask, True, None, 0.0).mask
    assert make_problem(q, k, v, mask, True, None, 0.0).mask is first
    assert repr(first) == repr(mask & mh.Mask.causal())
    keep = torch.ones(6, 6, dtype=torch.bool).tril() & (torch.arange(6) < 5)
    expected = mh.attention(q, k, v, mh.Mask.keep(keep))
    torch.testing.assert_close(mh.attention(q, k, v, mask, causal=True), expected)
    torch.testing.assert_close(mh.attention(q, k, v, mask, causal=True), expected)
