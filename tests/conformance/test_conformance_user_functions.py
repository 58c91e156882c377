"""Mask.mask_mod and Mask.score_mod: FlexAttention's signatures, exact on every backend, differentiable,
compiled with fullgraph=True, and combined with the other kinds by `&`."""
from __future__ import annotations

import pytest
import torch
import torch.utils._pytree as pytree

import multihead as mh
from multihead.errors import CannotRunError
from multihead import Mask
from multihead.masks import Index
from tests.conformance.check import BACKENDS
from tests.conformance.reference import PartSpec, reference_attention

B, H, L, D = 2, 4, 24, 8


def qkv(dtype=torch.float32, seed=0, Lq=L, Lk=L):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Lq, D, generator=g).to(dtype), torch.randn(B, H, Lk, D, generator=g).to(dtype),
            torch.randn(B, H, Lk, D, generator=g).to(dtype))


def relative_bias(table, Lk):
    """score + table[h, q - kv + Lk - 1]: a learnable relative-position bias (T5-like, one entry per distance)."""
    def relative(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + Lk - 1]
    return relative


def near(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx).abs() <= 5


def run_or_skip(q, k, v, mask, backend):
    try:
        return mh.attention(q, k, v, mask, backend=backend)
    except CannotRunError as e:  # only a refusal skips: any other AttentionError fails the test
        pytest.skip(f"{backend}: {e.code}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_lengths", [False, True])
def test_mask_mod_and_score_mod_are_exact_on_every_backend(backend, with_lengths):
    q, k, v = qkv(torch.float64)
    table = torch.randn(H, 2 * L - 1, dtype=torch.float64)
    valid = torch.tensor([17, 24])
    specs = [PartSpec("mask_mod", {"fn": near}), PartSpec("score_mod", {"fn": relative_bias(table, L)}),
             PartSpec("causal", {"align": "top_left"})]
    if with_lengths:  # gives varlen its slices
        specs.append(PartSpec("lengths", {"valid": valid}))
    mask = Mask.mask_mod(near) & Mask.score_mod(relative_bias(table, L)) & Mask.causal()
    if with_lengths:
        mask = mask & Mask.lengths(valid)
    with torch.no_grad():  # CPU flex has no backward; gradients are tested below
        out = run_or_skip(q, k, v, mask, backend)
    torch.testing.assert_close(out, reference_attention(q, k, v, specs), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["auto", "math", "sdpa", "varlen", "banded"])
def test_a_learnable_bias_table_gets_the_float64_reference_gradient(backend):
    q, k, v = qkv(torch.float32, seed=1)
    table = torch.randn(H, 2 * L - 1, requires_grad=True)
    table64 = table.detach().double().requires_grad_()
    valid = torch.tensor([20, 24])
    mask = Mask.score_mod(relative_bias(table, L)) & Mask.causal() & Mask.lengths(valid)
    out = run_or_skip(q, k, v, mask, backend)
    specs = [PartSpec("score_mod", {"fn": relative_bias(table64, L)}), PartSpec("causal", {"align": "top_left"}),
             PartSpec("lengths", {"valid": valid})]
    ref = reference_attention(q.double(), k.double(), v.double(), specs)
    upstream = torch.randn(ref.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    (out.double() * upstream).sum().backward()
    (ref * upstream).sum().backward()
    assert table.grad is not None and table.grad.abs().sum() > 0
    torch.testing.assert_close(table.grad.double(), table64.grad, rtol=1e-4, atol=1e-5)


def test_compiled_fullgraph_matches_eager_and_trains_the_table():
    q, k, v = qkv(torch.float32, seed=3)
    table = torch.randn(H, 2 * L - 1, requires_grad=True)
    mask = Mask.score_mod(relative_bias(table, L)) & Mask.mask_mod(near) & Mask.causal()
    compiled = torch.compile(lambda q, k, v, m: mh.attention(q, k, v, m), fullgraph=True, dynamic=True)
    out = compiled(q, k, v, mask)
    out.sum().backward()
    grad = table.grad.clone()
    table.grad = None
    eager = mh.attention(q, k, v, mask)
    eager.sum().backward()
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, table.grad, rtol=1e-4, atol=1e-6)


def test_dispatch_says_a_score_mod_runs_the_reference_math_in_place_of_the_kernel():
    q, k, v = qkv()
    table = torch.zeros(H, 2 * L - 1)
    detail = str(mh.dispatch(q, k, v, Mask.score_mod(relative_bias(table, L))))
    chosen, *others = detail.splitlines()
    assert chosen.startswith("math:"), "one thing is said: math runs the call"
    (sdpa,) = [line for line in others if line.strip().startswith("sdpa:")]
    assert "not chosen" in sdpa and "score_mod" in sdpa
    assert "reference math" not in str(mh.dispatch(q, k, v, Mask.mask_mod(near))).splitlines()[0]


def test_flex_takes_them_natively():
    q, k, v = qkv(torch.float64, seed=4)
    table = torch.randn(H, 2 * L - 1, dtype=torch.float64)
    mask = Mask.score_mod(relative_bias(table, L)) & Mask.mask_mod(near)
    with torch.no_grad():  # CPU flex has no backward, and a user function may capture learnable tensors
        detail = mh.dispatch(q, k, v, mask, backend="flex").detail
    assert "mask_mod = mask_mod(near)" in detail and "score_mod = score_mod(relative)" in detail


def test_they_are_pytree_nodes_with_the_function_as_static_context():
    mask = Mask.mask_mod(near) & Mask.causal()
    leaves, spec = pytree.tree_flatten(mask)
    assert leaves == []
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert rebuilt.parts[0].fn is near and repr(rebuilt) == repr(mask)


def test_every_grid_form_passes_broadcastable_integer_indices():
    seen = []

    def record(b, h, q_idx, kv_idx):
        seen.append(tuple(tuple(t.shape) for t in (b, h, q_idx, kv_idx)))
        assert all(not t.is_floating_point() for t in (b, h, q_idx, kv_idx))
        return torch.broadcast_tensors(b, h, q_idx, kv_idx)[0] >= 0

    part = Mask.mask_mod(record).parts[0]
    whole = Index.grid(2, 3, 5, 7, "cpu")
    grids = [whole, Index.slice(1, 2, 4, 0, 6, 4, 6, (), "cpu", H=3), whole.block(0, 2, 3, 7)]
    shapes = [tuple(part.keep(ix).shape) for ix in grids]
    assert shapes == [(2, 3, 5, 7), (1, 3, 2, 6), (2, 3, 2, 4)]
    assert seen[0] == ((2, 1, 1, 1), (1, 3, 1, 1), (1, 1, 5, 1), (1, 1, 1, 7))


def test_bad_functions_raise_attention_errors():
    q, k, v = qkv()
    with pytest.raises(mh.AttentionError, match="expects a function"):
        Mask.mask_mod(torch.ones(3))
    with pytest.raises(mh.AttentionError, match="expects a function"):
        Mask.score_mod(None)
    with pytest.raises(mh.AttentionError, match="must return a bool tensor"):
        mh.attention(q, k, v, Mask.mask_mod(lambda b, h, i, j: (i - j).float()))
    with pytest.raises(mh.AttentionError, match="must return a float tensor"):
        mh.attention(q, k, v, Mask.score_mod(lambda s, b, h, i, j: i - j))
