"""The NaN / inf contract on every backend and dtype.

- Keys no query may see (padding, lengths) are inert: NaN or inf stored there reaches neither the
  output nor the gradients.
- NaN in a query, or in a key some query keeps, propagates like torch: the rows that use it are NaN;
  the others are right or, where torch's own kernel also spreads it (a bool mask), NaN.
- Rows that keep no key are exactly 0 with exactly 0 gradient, even when their query is NaN.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.errors import CannotRunError
from tests.conformance.cases import DTYPES
from tests.conformance.check import BACKENDS, tolerance
from tests.conformance.reference import PartSpec, build_mask, dense_terms, reference_attention

B, H, HKV, LQ, LK, D = 2, 4, 2, 6, 9, 8
DTYPE_IDS = [str(d).removeprefix("torch.") for d in DTYPES]


def inputs(dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, LQ, D, generator=g, dtype=torch.float64), torch.randn(B, HKV, LK, D, generator=g,
            dtype=torch.float64), torch.randn(B, HKV, LK, D, generator=g, dtype=torch.float64))


def attend(q, k, v, specs, backend, grad: bool):
    """mh.attention on leaves in q's dtype; (out, (dq, dk, dv) or None); pytest.skip where it cannot run."""
    leaves = [t.detach().clone().requires_grad_(grad) for t in (q, k, v)]
    try:
        with torch.set_grad_enabled(grad):
            out = mh.attention(*leaves, build_mask(specs), backend=backend)
    except CannotRunError as e:  # only a refusal skips: any other AttentionError fails the test
        pytest.skip(f"{backend}: {e.code}")
    if not grad:
        return out, None
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    return out, torch.autograd.grad((out.double() * upstream).sum(), leaves)


def grad_wanted(backend: str) -> bool:
    """Whether the backend runs calls that need grad on the CPU: flex (torch's CPU flex_attention) and the
    decode kernel have no backward, so they run these tests without grad rather than being skipped."""
    return backend not in ("flex", "decode")


HIDING = {
    "key_padding": [PartSpec("key_padding", {"pad": torch.arange(LK).expand(B, LK) >= torch.tensor([[6], [9]])})],
    "lengths": [PartSpec("lengths", {"valid": torch.tensor([4, 9])}), PartSpec("causal", {"align": "bottom_right"})],
    "lengths_query": [PartSpec("lengths", {"valid": torch.tensor([7, 3]), "query": torch.tensor([6, 2])})],
    "lengths_per_query": [PartSpec("lengths", {"valid": torch.tensor([[1, 2, 3, 4, 5, 6], [0, 9, 2, 2, 8, 1]])})],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("hiding", list(HIDING))
def test_keys_no_query_may_see_are_inert(hiding, backend, dtype):
    specs = HIDING[hiding]
    q, k, v = inputs(dtype)
    keep, _ = dense_terms(specs, B, H, LQ, LK)
    hidden = ~keep.any(dim=2).any(dim=1)  # (B, Lk)
    assert hidden.any()
    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[hidden[:, None, :].expand(B, HKV, LK)] = float("nan")
    poisoned_v[hidden[:, None, :].expand(B, HKV, LK)] = float("inf")
    lows = [t.to(dtype) for t in (q, poisoned_k, poisoned_v)]
    out, grads = attend(*lows, specs, backend, grad_wanted(backend))
    exact = reference_attention(*(t.double() for t in lows), specs)
    tol = tolerance(reference_attention(*lows, specs, dtype=dtype), exact, dtype)
    assert torch.isfinite(out).all(), "NaN / inf stored at hidden keys reached the output"
    assert (out.double() - exact).abs().max() <= tol
    if grads is not None:
        assert all(torch.isfinite(g).all() for g in grads), "NaN / inf at hidden keys reached a gradient"
        for g in grads[1:]:  # dk, dv at hidden keys: exactly 0
            assert (g[hidden[:, None, :].expand(B, HKV, LK)] == 0).all()


def rows_keeping(specs, key: int) -> torch.Tensor:
    """(B, H, Lq) rows that keep key `key` (of kv head 0: query heads 0 .. H/Hkv - 1)."""
    keep, _ = dense_terms(specs, B, H, LQ, LK)
    return keep[..., key]


CAUSAL_PADDED = [PartSpec("lengths", {"valid": torch.tensor([9, 5]), "query": torch.tensor([6, 3])}),
                 PartSpec("causal", {"align": "top_left"})]
NAN_QUERY_MASKS = {
    "none": [],
    "causal": [PartSpec("causal", {"align": "top_left"})],
    "key_padding": HIDING["key_padding"],
    "lengths": [PartSpec("lengths", {"valid": torch.tensor([6, 9])})],
    "causal_padded": CAUSAL_PADDED,
}
# measured on d54b0e5: SDPA's is_causal / unmasked kernel and the per-slice path return 0 for a NaN query


def nan_query_cases():
    for name in NAN_QUERY_MASKS:
        for backend in BACKENDS:
            yield pytest.param(name, backend, id=f"{name}-{backend}")


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize(("masked", "backend"), nan_query_cases())
def test_nan_in_a_query_makes_its_row_nan_and_leaves_the_others(masked, backend, dtype):
    specs = NAN_QUERY_MASKS[masked]
    q, k, v = inputs(dtype, seed=1)
    q[0, 1, 2] = float("nan")  # a row that keeps keys: NaN, like torch
    dead = ~dense_terms(specs, B, H, LQ, LK)[0].any(dim=-1)  # (B, H, Lq)
    q[dead] = float("nan")  # padded queries keep no key: exact 0 even so
    lows = [t.to(dtype) for t in (q, k, v)]
    out, _ = attend(*lows, specs, backend, grad=False)
    assert torch.isnan(out[0, 1, 2]).all(), "NaN in a query was hidden"
    assert (out[dead] == 0).all()
    clean = ~dead
    clean[0, 1, 2] = False
    exact = reference_attention(*(t.double() for t in lows), specs)
    tol = tolerance(reference_attention(*lows, specs, dtype=dtype)[clean], exact[clean], dtype)
    assert (out.double()[clean] - exact[clean]).abs().max() <= tol


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_a_visible_key_reaches_exactly_the_rows_that_keep_it(backend, dtype):
    q, k, v = inputs(dtype, seed=2)
    k[0, 0, 3] = float("nan")  # kv head 0 serves query heads 0 and 1
    lows = [t.to(dtype) for t in (q, k, v)]
    out, _ = attend(*lows, CAUSAL_PADDED, backend, grad=False)
    using = torch.zeros(B, H, LQ, dtype=torch.bool)
    using[0, : H // HKV] = rows_keeping(CAUSAL_PADDED, 3)[0, : H // HKV]
    assert using.any() and torch.isnan(out[using]).all(), "NaN in a visible key was hidden"
    # Rows that do not keep the key: torch's own SDPA with a bool mask makes them NaN too (its CPU flash
    # kernel multiplies the NaN score's zero weight), with is_causal it does not; either is "like torch".
    # What is not allowed: a wrong finite value, or NaN in a row that keeps no key at all.
    dead = ~dense_terms(CAUSAL_PADDED, B, H, LQ, LK)[0].any(dim=-1)
    assert (out[dead] == 0).all()
    exact = reference_attention(*(t.double() for t in lows), CAUSAL_PADDED)
    tol = tolerance(reference_attention(*lows, CAUSAL_PADDED, dtype=dtype)[~using], exact[~using], dtype)
    other = ~using & ~torch.isnan(out).any(dim=-1)
    assert (out.double()[other] - exact[other]).abs().max() <= tol


EMPTY_ROWS = {
    "lengths": [PartSpec("lengths", {"valid": torch.tensor([0, 5]), "query": torch.tensor([6, 4])})],
    "keep": [PartSpec("keep", {"t": torch.arange(LQ)[:, None].expand(LQ, LK) % 2 == 0})],
    "window_bottom_right": [PartSpec("window", {"size": 2, "align": "bottom_right"}),
                            PartSpec("causal", {"align": "top_left"})],
    "additive": [PartSpec("additive", {"t": torch.zeros(LQ, LK).index_fill_(0, torch.tensor([1, 3]), float("-inf"))})],
}


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("empty", list(EMPTY_ROWS))
def test_rows_that_keep_no_key_are_exact_zeros_with_zero_gradient(empty, backend, dtype):
    specs = EMPTY_ROWS[empty]
    dead = ~dense_terms(specs, B, H, LQ, LK)[0].any(dim=-1)  # (B, H, Lq)
    assert dead.any()
    q, k, v = (t.to(dtype) for t in inputs(dtype, seed=3))
    out, grads = attend(q, k, v, specs, backend, grad_wanted(backend))
    assert (out[dead] == 0).all()
    assert torch.isfinite(out[~dead]).all()
    if grads is not None:
        assert (grads[0][dead] == 0).all()
        assert all(torch.isfinite(g).all() for g in grads)
    q[dead] = float("nan")  # even a NaN query: the row keeps no key, so it is 0 (its NaN meets no key)
    out, _ = attend(q, k, v, specs, backend, grad=False)
    assert (out[dead] == 0).all()
    assert torch.isfinite(out[~dead]).all()
