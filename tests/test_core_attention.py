"""mh.attention: every backend against an independent float64 reference, values and gradients."""
from __future__ import annotations

import inspect

import pytest
import torch
from torch.overrides import TorchFunctionMode

import multihead as mh
from multihead.errors import CannotRunError
from helpers import DTYPES, drift_tolerance, max_abs_diff, reference_attention

BACKENDS = ("math", "sdpa")
# (B, H, Hkv, Lq, Lk, D, Dv): odd sizes, Lq != Lk both ways, L = 1, GQA and MQA
SHAPES = [(3, 6, 6, 5, 9, 5, 3), (2, 6, 2, 9, 5, 8, 8), (1, 4, 1, 1, 1, 16, 16), (2, 3, 3, 7, 7, 4, 4)]



def mask_cases(B, Lq, Lk):
    """(name, Mask, keep, bias): each convention, with its dense meaning written out independently."""
    g = torch.Generator().manual_seed(1)
    rand_keep = torch.rand(B, 1, Lq, Lk, generator=g) > 0.3
    bias = torch.randn(1, 1, Lq, Lk, generator=g)
    lens = torch.randint(0, Lk + 1, (B,), generator=g)
    lens2 = torch.randint(0, Lk + 1, (B, Lq), generator=g)
    pad = torch.rand(B, Lk, generator=g) > 0.7
    j, i = torch.arange(Lk), torch.arange(Lq)[:, None]
    tl, br = j <= i, j <= i + (Lk - Lq)
    neg_inf_bias = bias.masked_fill(~rand_keep[:1], float("-inf"))
    return [
        ("none", None, None, None),
        ("keep", mh.Mask.keep(rand_keep), rand_keep, None),
        ("keep-01", mh.Mask.keep(rand_keep.float()), rand_keep, None),
        ("block", mh.Mask.block(~rand_keep), rand_keep, None),
        ("additive", mh.Mask.additive(bias), None, bias),
        ("additive-inf", mh.Mask.additive(neg_inf_bias), rand_keep[:1], bias),
        ("lengths-B", mh.Mask.lengths(lens), (j < lens[:, None])[:, None, None], None),
        ("lengths-BLq", mh.Mask.lengths(lens2), (j < lens2[..., None])[:, None], None),
        ("key-padding", mh.Mask.key_padding(pad), ~pad[:, None, None], None),
        ("causal-top-left", mh.Mask.causal(), tl, None),
        ("causal-bottom-right", mh.Mask.causal("bottom_right"), br, None),
        ("lengths&causal", mh.Mask.lengths(lens) & mh.Mask.causal(), (j < lens[:, None])[:, None, None] & tl, None),
        ("padding&additive&keep", mh.Mask.key_padding(pad) & mh.Mask.additive(bias) & mh.Mask.keep(rand_keep),
         ~pad[:, None, None] & rand_keep, bias),
        ("query-lengths", mh.Mask.lengths(lens, query_lens=torch.tensor([Lq] + [Lq // 2] * (B - 1))),
         (j < lens[:, None])[:, None, None] & (i < torch.tensor([Lq] + [Lq // 2] * (B - 1))[:, None, None, None]),
         None),
    ]


def _inputs(shape, seed=0):
    B, H, Hkv, Lq, Lk, D, Dv = shape
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, Lq, D, generator=g), torch.randn(B, Hkv, Lk, D, generator=g),
            torch.randn(B, Hkv, Lk, Dv, generator=g)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_float64_reference_for_every_mask(backend, dtype, shape):
    B, _, _, Lq, Lk, _, _ = shape
    inputs = _inputs(shape)
    for name, mask, keep, bias in mask_cases(B, Lq, Lk):
        ref = lambda q, k, v, compute_dtype: reference_attention(q, k, v, keep, bias, compute_dtype=compute_dtype)  # noqa: E731
        (out64, grads64), (tol, grad_tols) = drift_tolerance(ref, inputs, dtype)
        leaves = [t.to(dtype).requires_grad_() for t in inputs]
        out = mh.attention(*leaves, mask, backend=backend)
        assert out.dtype == dtype and out.shape == out64.shape
        assert max_abs_diff(out, out64) <= tol, f"{name}: values drift beyond 2x the reference's"
        grads = torch.autograd.grad(out, leaves, torch.ones_like(out))
        for which, g, g64, gtol in zip("qkv", grads, grads64, grad_tols):
            assert max_abs_diff(g, g64) <= gtol, f"{name}: d{which} drifts beyond 2x the reference's"


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradcheck_float64(backend):
    q, k, v = (t.double().requires_grad_() for t in _inputs((2, 4, 2, 4, 5, 3, 3)))
    mask = mh.Mask.lengths(torch.tensor([0, 3])) & mh.Mask.additive(torch.randn(4, 5, dtype=torch.float64))
    assert torch.autograd.gradcheck(lambda q, k, v: mh.attention(q, k, v, mask, backend=backend), (q, k, v))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fully_masked_rows_give_exact_zero_output_and_gradients(backend, dtype):
    q, k, v = (t.to(dtype).requires_grad_() for t in _inputs((2, 4, 2, 5, 6, 8, 8)))
    keep = torch.ones(2, 1, 5, 6, dtype=torch.bool)
    keep[0, :, 2] = False  # batch 0, query 2 sees nothing
    mask = mh.Mask.keep(keep) & mh.Mask.lengths(torch.tensor([6, 0]))  # batch 1 sees nothing at all
    out = mh.attention(q, k, v, mask, backend=backend)
    (out * torch.randn_like(out)).sum().backward()
    assert not torch.isnan(out).any()
    assert (out[0, :, 2] == 0).all() and (out[1] == 0).all()
    assert (q.grad[0, :, 2] == 0).all() and (q.grad[1] == 0).all()
    assert (k.grad[1] == 0).all() and (v.grad[1] == 0).all()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_fills_never_overflow_in_half_precision(dtype):
    q, k, v = (t.to(dtype) * 30 for t in _inputs((1, 2, 2, 4, 4, 8, 8)))  # large scores
    mask = mh.Mask.additive(torch.full((4, 4), -6e4)) & mh.Mask.causal()
    for backend in BACKENDS:
        assert torch.isfinite(mh.attention(q, k, v, mask, backend=backend)).all()


class SdpaCalls(TorchFunctionMode):
    """The arguments of every torch.nn.functional.scaled_dot_product_attention call made inside it."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.nn.functional.scaled_dot_product_attention:
            self.calls.append(inspect.signature(func_signature).bind(*args, **(kwargs or {})).arguments)
        return func(*args, **(kwargs or {}))


def func_signature(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's signature."""


def test_pure_causal_mask_reaches_sdpa_as_is_causal():
    q, k, v = _inputs((1, 2, 2, 6, 6, 4, 4))
    with SdpaCalls() as spy:
        mh.attention(q, k, v, causal=True, backend="sdpa")
        mh.attention(q, k, v, mh.Mask.causal("bottom_right"), backend="sdpa")  # Lq == Lk: the same
    assert len(spy.calls) == 2
    for call in spy.calls:
        assert call.get("attn_mask") is None and call["is_causal"] is True
    assert "is_causal=True" in mh.dispatch(q, k, v, causal=True).detail


def test_causal_flag_equals_causal_mask_and_combines():
    q, k, v = _inputs((2, 2, 2, 5, 5, 4, 4))
    lens = mh.Mask.lengths(torch.tensor([5, 2]))
    a = mh.attention(q, k, v, lens, causal=True)
    b = mh.attention(q, k, v, lens & mh.Mask.causal())
    assert torch.equal(a, b)


def test_scale_and_dropout():
    q, k, v = _inputs((1, 2, 2, 3, 4, 4, 4))
    ref = reference_attention(q, k, v, scale=0.1)
    assert max_abs_diff(mh.attention(q, k, v, scale=0.1, backend="math"), ref) < 1e-6
    torch.manual_seed(0)
    dropped = mh.attention(q, k, v, dropout=0.5, backend="math")
    assert not torch.allclose(dropped, mh.attention(q, k, v, backend="math"))


def test_empty_sequences():
    q, k, v = _inputs((2, 2, 2, 3, 4, 5, 6))
    assert mh.attention(q[:, :, :0], k, v).shape == (2, 2, 0, 6)
    out = mh.attention(q, k[:, :, :0], v[:, :, :0])
    assert out.shape == (2, 2, 3, 6) and (out == 0).all()
    assert mh.dispatch(q, k[:, :, :0], v[:, :, :0]).backend == "math"


def test_dispatch_reports_choice_and_reasons():
    q, k, v = _inputs((2, 2, 2, 3, 3, 4, 4))
    auto = mh.dispatch(q, k, v, mh.Mask.key_padding(torch.tensor([[False, False, True], [False, True, True]])))
    assert auto.backend == "sdpa" and auto.codes["math"] == "math.materialises"
    assert "mask of shape (2, 1, 1, 3)" in auto.detail and "zeroed in k and v" in auto.detail  # padding is inert
    one_row = mh.dispatch(q[:1], k[:1], v[:1], mh.Mask.key_padding(torch.tensor([[False, False, True]])))
    assert "only the first 2 keys" in one_row.detail  # one row of padding: the kept keys alone, no mask
    forced = mh.dispatch(q, k, v, backend="math")
    assert forced.backend == "math" and forced.codes["sdpa"] == "not-requested"
    assert "math: not chosen" in str(auto)
    with pytest.raises(CannotRunError) as refused:
        mh.attention(q, k[:, :, :0], v[:, :, :0], backend="sdpa")
    assert refused.value.code == "sdpa.empty" and refused.value.backend == "sdpa"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_large_finite_offsets_never_become_inf_in_half_precision(dtype):
    """Document 000's `mask * -1e9` as an additive mask, in fp16/bf16: no -inf, no NaN, on every backend.

    (A row offset by -1e9 on *every* key is ill-conditioned: exactly, softmax(s - 1e9) = softmax(s), but
    float32 absorbs s into -1e9 and gives uniform weights. Only finiteness is claimed for that row.)
    """
    q, k, v = (t.to(dtype) for t in _inputs((1, 2, 2, 3, 4, 8, 8)))
    offsets = torch.zeros(3, 4)
    offsets[1] = -1e9  # query 1: every key pushed down by the same huge amount
    offsets[2, 1:] = -1e9  # query 2: only key 0 left
    mask = mh.Mask.additive(offsets)
    for backend in BACKENDS:
        out = mh.attention(q, k, v, mask, backend=backend)
        assert torch.isfinite(out).all(), backend
        assert torch.allclose(out[:, :, 2].float(), v[:, :, 0].float(), atol=1e-2), backend


@pytest.mark.parametrize("extension", [True, False], ids=["compiled extension", "torch ops"])
@pytest.mark.parametrize("layout", ["contiguous", "a module's transposed view"])
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
def test_a_nan_or_inf_query_row_stays_nan_and_only_that_row(extension, layout, dtype, monkeypatch):
    """The CPU flash kernel returns such a row as zeros when it has no mask; the NaN-row rule (the compiled
    extension's pass over q's rows, or torch ops where it is switched off: MULTIHEAD_DECODE_KERNEL=0, or for
    fp16) makes it NaN again, in no-grad calls and in calls that record autograd alike."""
    from multihead.backends.cpu import build as decode_build

    if not extension:
        monkeypatch.setattr(decode_build, "_state", {"module": None, "why": "switched off"})
    q, k, v = (t.to(dtype) for t in _inputs((2, 4, 4, 6, 6, 8, 8)))
    if layout != "contiguous":
        q = q.transpose(1, 2).contiguous().transpose(1, 2)  # (B, H, L, D) over (B, L, H, D) memory
    q[0, 1, 2, 3], q[1, 3, 5, 0] = float("nan"), float("inf")
    for grad in (False, True):
        leaf = q.clone().requires_grad_(grad)
        for causal in (False, True):
            out = mh.attention(leaf, k, v, causal=causal)
            rows = out.isnan().all(-1)  # (B, H, Lq)
            assert rows[0, 1, 2] and rows[1, 3, 5] and rows.sum() == 2, (grad, causal)
            assert not out[~rows].isnan().any()
