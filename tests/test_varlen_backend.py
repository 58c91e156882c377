"""The length-aware backend: same values and gradients as the dense path, cost only on valid slices."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.errors import CannotRunError
from multihead.attention import make_problem
from multihead.backends.varlen import VarlenBackend
from tests.helpers import drift_tolerance, max_abs_diff, reference_attention

KEY_LENS = torch.tensor([7, 3, 0, 5])
QUERY_LENS = torch.tensor([6, 7, 4, 0])


def _qkv(B=4, H=4, Hkv=None, L=7, D=8, dtype=torch.float32, seed=0):
    Hkv = H if Hkv is None else Hkv
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, L, D, generator=g)  # (B, H, L, D)
    k, v = (torch.randn(B, Hkv, L, D, generator=g) for _ in range(2))  # (B, Hkv, L, D)
    return [t.to(dtype) for t in (q, k, v)]


def _mask(query_lens: bool, causal: bool) -> mh.Mask:
    mask = mh.Mask.lengths(KEY_LENS, query_lens=QUERY_LENS if query_lens else None)
    return mask & mh.Mask.causal() if causal else mask


def _keep(mask: mh.Mask, q, k):
    B, H, Lq, _ = q.shape
    return mask.materialize(B, H, Lq, k.shape[2])[0]


@pytest.mark.parametrize("query_lens", (False, True), ids=("keys", "both"))
@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
@pytest.mark.parametrize("heads", ((4, 4), (4, 2)), ids=("mha", "gqa"))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_values_and_grads_match_float64_reference(query_lens, causal, heads, dtype):
    q, k, v = _qkv(H=heads[0], Hkv=heads[1], dtype=dtype)
    mask = _mask(query_lens, causal)
    keep = _keep(mask, q, k)
    (out64, grads64), (tol, grad_tols) = drift_tolerance(
        lambda *t, compute_dtype: reference_attention(*t, keep=keep, compute_dtype=compute_dtype),
        (q, k, v), dtype)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = mh.attention(*leaves, mask, backend="varlen")
    grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
    assert out.dtype == dtype
    assert max_abs_diff(out, out64) <= tol
    for g, g64, g_tol in zip(grads, grads64, grad_tols):
        assert max_abs_diff(g, g64) <= g_tol


@pytest.mark.parametrize("causal", (False, True), ids=("full", "causal"))
def test_same_values_and_grads_as_the_dense_path(causal):
    q, k, v = _qkv()
    mask = _mask(True, causal)
    results = {}
    for backend in ("varlen", "sdpa"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = mh.attention(*leaves, mask, backend=backend)
        upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        results[backend] = (out, torch.autograd.grad(out, leaves, upstream))
    (out_a, grads_a), (out_b, grads_b) = results["varlen"], results["sdpa"]
    torch.testing.assert_close(out_a, out_b, atol=1e-5, rtol=1e-5)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, atol=1e-5, rtol=1e-5)


def test_padding_and_fully_masked_rows_are_exact_zeros_with_zero_grads():
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = mh.attention(q, k, v, _mask(True, False), backend="varlen")
    out.sum().backward()
    assert (out[2] == 0).all()  # no valid key
    assert (out[3] == 0).all()  # no valid query
    assert (out[0, :, 6:] == 0).all() and (out[0, :, :6] != 0).any()  # queries past query_lens
    assert (q.grad[2] == 0).all() and (q.grad[3] == 0).all() and (q.grad[0, :, 6:] == 0).all()
    assert (k.grad[1, :, 3:] == 0).all() and (v.grad[1, :, 3:] == 0).all()  # keys past valid_lens
    assert (k.grad[2] == 0).all() and (v.grad[3] == 0).all()


def test_dropout_keeps_padding_at_zero():
    q, k, v = _qkv()
    torch.manual_seed(0)
    out = mh.attention(q, k, v, _mask(True, False), dropout=0.5, backend="varlen")
    assert (out[0, :, 6:] == 0).all() and torch.isfinite(out).all()


def test_auto_picks_varlen_for_heavy_padding_and_says_why():
    q, k, v = _qkv(B=2, H=2, L=512, D=64)
    decision = mh.dispatch(q, k, v, mh.Mask.lengths(torch.tensor([64, 512])))
    assert decision.backend == "varlen"
    assert "per slice" in decision.detail and "44% of the (Lq, Lk) grid" in decision.detail
    assert decision.codes["sdpa"] == "ranked-after"


@pytest.mark.parametrize("lens, L, code", [
    ([500, 512], 512, "varlen.little-padding"),  # 1% of the grid is padding
    ([2, 8], 8, "varlen.too-little-saved"),  # tiny sequences: separate calls would cost more
])
def test_auto_declines_when_slicing_does_not_pay(lens, L, code):
    q, k, v = _qkv(B=2, H=2, L=L, D=8)
    decision = mh.dispatch(q, k, v, mh.Mask.lengths(torch.tensor(lens)))
    assert decision.backend == "sdpa" and decision.codes["varlen"] == code


@pytest.mark.parametrize("mask, why", [
    (mh.Mask.causal(), "cuts rows into slices"),
    (mh.Mask.lengths(torch.full((4, 7), 3)), "cuts rows into slices"),
])
def test_masks_it_cannot_slice_are_refused_with_the_reason(mask, why):
    q, k, v = _qkv()
    problem = make_problem(q, k, v, mask, False, None, 0.0)
    reason = VarlenBackend().plan(problem, auto=False)
    assert reason.cannot and why in reason.text(problem)
    with pytest.raises(CannotRunError, match="cannot run this call") as refused:
        mh.attention(q, k, v, mask, backend="varlen")
    assert refused.value.code == reason.code == "varlen.no-slicer"


def test_two_lengths_parts_slice_at_the_tighter_of_each_pair():
    q, k, v = _qkv()
    other = torch.tensor([2, 7, 7, 1])
    mask = mh.Mask.lengths(KEY_LENS) & mh.Mask.lengths(other)
    expected = mh.attention(q, k, v, mh.Mask.lengths(torch.minimum(KEY_LENS, other)), backend="math")
    torch.testing.assert_close(mh.attention(q, k, v, mask, backend="varlen"), expected, atol=1e-5, rtol=1e-5)


PAD = torch.rand(4, 7, generator=torch.Generator().manual_seed(3)) > 0.7
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])


def _by_hand(kind: str, qlens, klens, Lq: int, Lk: int):
    """(keep, bias) for `kind`, written with loops, per sequence, independently of multihead."""
    B = len(klens)
    keep = torch.zeros(B, 1, Lq, Lk, dtype=torch.bool)
    bias = torch.zeros(B, 4, Lq, Lk)
    for b in range(B):
        offset = klens[b] - qlens[b]  # bottom-right: last valid query at last valid key
        for i in range(qlens[b]):
            for j in range(klens[b]):
                ok = {"bottom-right": j <= i + offset,
                      "bottom-right-window": i + offset - 2 < j <= i + offset,
                      "key-padding": not PAD[b, j],
                      "alibi": True}[kind]
                keep[b, 0, i, j] = ok
                bias[b, :, i, j] = -SLOPES * (i - j) if kind == "alibi" else 0.0
    return keep, bias


@pytest.mark.parametrize("kind, extra", [
    ("bottom-right", mh.Mask.causal("bottom_right")),
    ("bottom-right-window", mh.Mask.causal("bottom_right") & mh.Mask.window(2, "bottom_right")),
    ("key-padding", mh.Mask.key_padding(PAD)),
    ("alibi", mh.Mask.alibi(SLOPES)),
])
def test_other_parts_are_evaluated_on_each_slice(kind, extra):
    """Each sequence's slice sees the rest of the mask as the whole grid does: bottom-right causal lines
    up each sequence's last query with its last valid key, even when Lq != Lk."""
    q, k, v = _qkv(L=7)
    q = q[:, :, :3]
    qlens = [3, 1, 2, 3]
    mask = mh.Mask.lengths(KEY_LENS, query_lens=torch.tensor(qlens)) & extra
    keep, bias = _by_hand(kind, qlens, KEY_LENS.tolist(), 3, 7)
    ref = reference_attention(q, k, v, keep=keep, bias=bias).float()
    for backend in ("varlen", "sdpa", "math"):
        torch.testing.assert_close(mh.attention(q, k, v, mask, backend=backend), ref, atol=1e-5, rtol=1e-5)


def test_module_with_lengths_mask_matches_dense_backend():
    torch.manual_seed(0)
    x = torch.randn(2, 600, 32)
    auto = mh.MultiHeadAttention(32, 4)
    dense = mh.MultiHeadAttention(32, 4, backend="sdpa")
    dense.load_state_dict(auto.state_dict())
    mask = mh.Mask.lengths(torch.tensor([100, 600]), query_lens=torch.tensor([100, 600]))
    q = auto.q_proj(x).view(2, 600, 4, 8).transpose(1, 2)  # (B, H, L, D), only to ask dispatch
    assert mh.dispatch(q, q, q, mask).backend == "varlen"
    torch.testing.assert_close(auto(x, mask=mask), dense(x, mask=mask), atol=1e-5, rtol=1e-5)
