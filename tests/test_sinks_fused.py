"""Sinks that train on fused kernels: out * sigmoid(lse - sink) from the CPU flash kernel's log-sum-exp, on
sdpa, banded and varlen, with gradients into q, k, v and the sinks against a float64 reference.

Tolerances come from measured drift (300 queries, D=32, five seeds): fp32 outputs differ from float64 by
at most 9e-7 on the fused path and on the math path alike; bf16 by 1.5e-2 (math 1.8e-2), fp16 by 1.9e-3
(math 2.2e-3). fp32 gradients over 2100 keys drift by at most 3e-6.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead.backends.sink_rescale import flash_with_sinks
from multihead.errors import CannotRunError

WINDOW = mh.Mask.window(256) & mh.Mask.causal()  # gpt-oss's sliding layers use 128; any W shows the same


def _inputs(Lq, Lk=None, H=4, Hkv=2, D=16, dtype=torch.float32, seed=0):
    """q (1, H, Lq, D), k and v (1, Hkv, Lk, D), sinks (H,), all leaves that need grad."""
    g = torch.Generator().manual_seed(seed)
    Lk = Lq if Lk is None else Lk
    q = torch.randn(1, H, Lq, D, generator=g)
    k, v = (torch.randn(1, Hkv, Lk, D, generator=g) for _ in range(2))
    sinks = torch.randn(H, generator=g) * 2
    return [t.to(dtype).requires_grad_() for t in (q, k, v, sinks)]


def _with_grads(leaves, grad_out=None, **kw):
    """(out, grads of (out * grad_out).sum() into every leaf) for mh.attention(q, k, v, sinks=...)."""
    q, k, v, sinks = leaves
    out = mh.attention(q, k, v, sinks=sinks, **kw)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)) if grad_out is None else grad_out
    return out, torch.autograd.grad(out, leaves, grad_out.to(out.dtype)), grad_out


def _float64(leaves):
    return [t.detach().double().requires_grad_() for t in leaves]


def _assert_matches_float64(leaves, atol, rtol, backend="auto", **kw):
    out, grads, grad_out = _with_grads(leaves, backend=backend, **kw)
    ref, ref_grads, _ = _with_grads(_float64(leaves), grad_out.double(), backend="math", **kw)
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)
    for name, got, want in zip("q k v sinks".split(), grads, ref_grads):
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol, msg=lambda m, n=name: f"d{n}: {m}")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("mask", ["none", "bool", "additive"])
def test_the_rescaled_kernel_is_exact_in_float64(causal, mask):
    """The forward and the backward's identity (the kernel's backward given g * w and the sink-aware output)
    hold to float64 rounding, with GQA, a bool keep mask or an additive one."""
    q, k, v, sinks = _float64(_inputs(37, 29))
    g = torch.Generator().manual_seed(3)
    keep = (torch.rand(1, 1, 37, 29, generator=g) > 0.3) | (torch.arange(29) == 0)  # every row keeps a key
    bias = torch.randn(1, 4, 37, 29, generator=g, dtype=torch.float64)
    attn_mask = {"none": None, "bool": keep, "additive": bias}[mask]
    out = flash_with_sinks(q, k, v, sinks, attn_mask, causal, 0.3)
    grad_out = torch.randn(out.shape, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad(out, (q, k, v, sinks), grad_out)
    as_mask = {"none": None, "bool": mh.Mask.keep(keep), "additive": mh.Mask.additive(bias)}[mask]
    ref = mh.attention(q, k, v, as_mask, causal=causal, scale=0.3, sinks=sinks, backend="math")
    ref_grads = torch.autograd.grad(ref, (q, k, v, sinks), grad_out)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-12)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)


def test_the_kernel_backward_needs_the_sink_aware_output_in_its_delta_term():
    """The identity sink_rescale.py rests on, on torch's kernel itself (float64): its backward given the final
    output o' and either (lse', g) or (its own lse, g * w) gives the reference gradients; given the plain output
    o (delta = rowsum(g * o)) it does not."""
    q, k, v, sinks = _float64(_inputs(21, 17))
    backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True)
    share = torch.sigmoid(lse - sinks.view(1, -1, 1)).unsqueeze(-1)  # (B, H, Lq, 1)
    final = out * share
    g = torch.randn(final.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    ref = torch.autograd.grad(mh.attention(q, k, v, causal=True, sinks=sinks, backend="math"), (q, k, v), g)
    with_sink = torch.logaddexp(lse, sinks.view(1, -1, 1))
    by_lse_with_sink = backward(g, q, k, v, final, with_sink, 0.0, True)
    by_scaled_grad = backward(g * share, q, k, v, final, lse, 0.0, True)
    for grads in (by_lse_with_sink, by_scaled_grad):
        for got, want in zip(grads, ref):
            torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    wrong = backward(g * share, q, k, v, out, lse, 0.0, True)[0]
    assert (wrong - ref[0]).abs().max() > 1e-3


@pytest.mark.parametrize("case", ["plain", "causal", "padding", "alibi", "alibi both ways"])
def test_sdpa_carries_sinks_with_gradients(case):
    """ALiBi without causal has offsets up to slope * L in a row: the kernel gets them moved to 0 per row."""
    pad = torch.arange(300) >= 250  # the last 50 keys are padding
    alibi = mh.Mask.alibi(mh.alibi_slopes(4))
    kw = {"plain": {}, "causal": {"causal": True}, "padding": {"mask": mh.Mask.key_padding(pad[None])},
          "alibi": {"mask": alibi, "causal": True}, "alibi both ways": {"mask": alibi}}[case]
    leaves = _inputs(300)
    decision = mh.dispatch(*leaves[:3], sinks=leaves[3], **kw)
    assert decision.backend == "sdpa" and "log-sum-exp" in decision.detail
    _assert_matches_float64(leaves, 2e-6, 1e-5, **kw)


@pytest.mark.parametrize("backend, kw", [
    ("banded", {"mask": WINDOW}),
    ("varlen", {"mask": mh.Mask.lengths(torch.tensor([1500])), "causal": True}),
], ids=["window (gpt-oss)", "lengths"])
def test_banded_and_varlen_carry_sinks_at_2048_keys(backend, kw):
    leaves = _inputs(2100, H=2, Hkv=1)
    decision = mh.dispatch(*leaves[:3], sinks=leaves[3], **kw)
    assert decision.backend == backend and "log-sum-exp" in decision.detail
    _assert_matches_float64(leaves, 1e-5, 1e-4, **kw)


@pytest.mark.parametrize("dtype, atol", [(torch.bfloat16, 3e-2), (torch.float16, 4e-3)])
@pytest.mark.parametrize("mask", [None, WINDOW, mh.Mask.alibi(mh.alibi_slopes(4))], ids=["causal", "window", "alibi"])
def test_half_precision_forward_matches_float64(dtype, atol, mask):
    """bf16 and fp16 round the scores: ALiBi's offsets reach slope * L, so each row's largest goes to 0 first."""
    q, k, v, sinks = (t.detach() for t in _inputs(300, D=32, dtype=dtype))
    out = mh.attention(q, k, v, mask, causal=mask is None, sinks=sinks)
    ref = mh.attention(q.double(), k.double(), v.double(), mask, causal=mask is None, sinks=sinks.double(),
                       backend="math")
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=0)


def test_grad_modes_give_one_output():
    q, k, v, sinks = _inputs(200)
    with_grad = mh.attention(q, k, v, causal=True, sinks=sinks)
    assert with_grad.requires_grad
    with torch.no_grad():
        without = mh.attention(q, k, v, causal=True, sinks=sinks)
    with torch.inference_mode():
        inference = mh.attention(q, k, v, causal=True, sinks=sinks)
    torch.testing.assert_close(without, with_grad.detach(), atol=0, rtol=0)
    torch.testing.assert_close(inference, with_grad.detach(), atol=0, rtol=0)


def test_compiled_dynamic_forward_and_backward():
    compiled = torch.compile(lambda q, k, v, s: mh.attention(q, k, v, causal=True, sinks=s), dynamic=True)
    for L in (40, 75):  # a second length reuses the dynamic graph
        leaves = _inputs(L)
        out = compiled(*leaves)
        grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(L))
        grads = torch.autograd.grad(out, leaves, grad_out)
        ref, ref_grads, _ = _with_grads(_float64(leaves), grad_out.double(), causal=True, backend="math")
        torch.testing.assert_close(out.double(), ref, atol=2e-6, rtol=1e-5)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got.double(), want, atol=2e-6, rtol=1e-5)


def test_a_sequence_with_every_key_padded_is_zero_with_zero_gradient():
    q, k, v, sinks = (t.detach().expand(2, *t.shape[1:]).clone().requires_grad_() if t.dim() == 4 else t
                      for t in _inputs(64))
    padding = torch.zeros(2, 64, dtype=torch.bool)
    padding[1] = True  # the second sequence has no key at all
    mask = mh.Mask.key_padding(padding)
    assert mh.dispatch(q, k, v, mask, sinks=sinks).backend == "sdpa"
    _assert_matches_float64([q, k, v, sinks], 2e-6, 1e-5, mask=mask)
    out = mh.attention(q, k, v, mask, sinks=sinks)
    assert bool((out[1] == 0).all())


@pytest.mark.parametrize("why, code", [
    ("dropout", "fused.sinks-dropout"), ("head dims", "fused.sinks-head-dims"), ("mask grad", "fused.sinks-mask-grad"),
])
def test_what_the_fused_kernel_cannot_carry_goes_to_the_math_with_its_reason(why, code):
    q, k, v, sinks = _inputs(32)
    kw = {}
    if why == "dropout":
        kw["dropout"] = 0.1
    elif why == "head dims":
        v = torch.randn(1, 2, 32, 8, requires_grad=True)
    else:
        kw["mask"] = mh.Mask.additive(torch.zeros(32, 32, requires_grad=True))
    decision = mh.dispatch(q, k, v, sinks=sinks, **kw)
    assert decision.backend == "math" and decision.codes["sdpa"] == code
    with pytest.raises(CannotRunError) as refused:
        mh.attention(q, k, v, sinks=sinks, backend="sdpa", **kw)
    assert refused.value.code == code


@st.composite
def _sink_problems(draw):
    """Small q, k, v, sinks (all need grad) and a mask combining causal, a window, key padding, a keep mask."""
    Hkv = draw(st.integers(1, 2))
    H, D = Hkv * draw(st.integers(1, 2)), draw(st.integers(1, 8))
    Lq, Lk = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    leaves = [torch.randn(2, H, Lq, D, generator=g), torch.randn(2, Hkv, Lk, D, generator=g),
              torch.randn(2, Hkv, Lk, D, generator=g), torch.randn(H, generator=g) * 3]
    mask = None
    align = draw(st.sampled_from(["top_left", "bottom_right"]))
    parts = [mh.Mask.causal(align), mh.Mask.window(draw(st.integers(1, 4)), align),
             mh.Mask.key_padding(torch.rand(2, Lk, generator=g) > 0.7),
             mh.Mask.keep(torch.rand(Lq, Lk, generator=g) > 0.3)]
    for part, used in zip(parts, draw(st.lists(st.booleans(), min_size=4, max_size=4))):
        if used:
            mask = part if mask is None else mask & part
    return [t.requires_grad_() for t in leaves], mask


@settings(max_examples=30, deadline=None)
@given(_sink_problems())
def test_any_mask_with_sinks_on_sdpa_matches_float64(problem):
    """Rows that keep no key, keys no query sees, GQA and every alignment: values and gradients exact."""
    leaves, mask = problem
    _assert_matches_float64(leaves, 2e-6, 1e-5, mask=mask, backend="sdpa")
