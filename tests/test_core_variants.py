"""Windows, ALiBi, segments, softcap and sinks: every backend against a float64 reference written here."""
from __future__ import annotations

import math

import pytest
import torch

import multihead as mh
from tests.helpers import reference_attention

B, H, Hkv, L, D = 2, 4, 2, 7, 8
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
IDS = torch.tensor([[0, 0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1, 1]])


def _qkv(seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, L, D, generator=g, dtype=dtype), torch.randn(B, Hkv, L, D, generator=g, dtype=dtype),
            torch.randn(B, Hkv, L, D, generator=g, dtype=dtype))


def _by_hand(kind: str):
    """(keep (B, 1, L, L), bias (1, H, L, L)) for `kind`, written with loops."""
    keep = torch.ones(B, 1, L, L, dtype=torch.bool)
    bias = torch.zeros(1, H, L, L, dtype=torch.float64)
    for b in range(B):
        for i in range(L):
            for j in range(L):
                if kind == "window&causal":
                    keep[b, 0, i, j] = i - 3 < j <= i
                elif kind == "window":
                    keep[b, 0, i, j] = i - 3 < j
                elif kind == "segments&causal":
                    keep[b, 0, i, j] = IDS[b, i] == IDS[b, j] and j <= i
                elif kind == "alibi&causal":
                    keep[b, 0, i, j] = j <= i
                    bias[0, :, i, j] = -SLOPES.double() * (i - j)
    return keep, bias


MASKS = {
    "window&causal": mh.Mask.window(3) & mh.Mask.causal(),
    "window": mh.Mask.window(3),
    "segments&causal": mh.Mask.segments(IDS) & mh.Mask.causal(),
    "alibi&causal": mh.Mask.alibi(SLOPES) & mh.Mask.causal(),
}


@pytest.mark.parametrize("backend", ["math", "sdpa", "auto"])
@pytest.mark.parametrize("kind", sorted(MASKS))
def test_mask_kinds_match_the_reference_values_and_grads(kind, backend):
    keep, bias = _by_hand(kind)
    q, k, v = (t.requires_grad_() for t in _qkv())
    out = mh.attention(q, k, v, MASKS[kind], backend=backend)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference_attention(q64, k64, v64, keep=keep, bias=bias)
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    grads64 = torch.autograd.grad(ref.sum(), (q64, k64, v64))
    for g, g64 in zip(grads, grads64):
        torch.testing.assert_close(g.double(), g64, atol=1e-4, rtol=1e-4)


def _capped_sinks_reference(q, k, v, softcap=None, sinks=None, keep=None):
    """float64: softmax over [cap(q k^T / sqrt(D)), sink] without the sink's column, times v."""
    q, k, v = (t.double() for t in (q, k, v))
    k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
    s = q @ k.transpose(-1, -2) / math.sqrt(D)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, H, 1, 1).expand(B, H, L, 1)], -1)
    w = torch.softmax(s, -1).nan_to_num(0.0)
    return w[..., :L] @ v


@pytest.mark.parametrize("softcap, sinks", [(2.0, None), (None, torch.tensor([0.5, -1.0, 2.0, 0.0])),
                                            (5.0, torch.tensor([1.0, 1.0, -3.0, 0.25]))])
@pytest.mark.parametrize("causal", [False, True])
def test_softcap_and_sinks_match_the_reference(softcap, sinks, causal):
    q, k, v = _qkv(1)
    keep = torch.ones(L, L, dtype=torch.bool).tril() if causal else None
    out = mh.attention(q, k, v, causal=causal, softcap=softcap, sinks=sinks)
    torch.testing.assert_close(out.double(), _capped_sinks_reference(q, k, v, softcap, sinks, keep), atol=1e-5, rtol=1e-5)
    decision = mh.dispatch(q, k, v, causal=causal, softcap=softcap, sinks=sinks)
    assert decision.backend == "math" and decision.codes["sdpa"] in ("fused.softcap", "fused.sinks")


def test_sink_gradient_matches_float64():
    q, k, v = _qkv(2)
    sinks = torch.tensor([0.5, -1.0, 2.0, 0.0], requires_grad=True)
    mh.attention(q, k, v, causal=True, sinks=sinks).sum().backward()
    s64 = sinks.detach().double().requires_grad_()
    keep = torch.ones(L, L, dtype=torch.bool).tril()
    _capped_sinks_reference(q, k, v, sinks=s64, keep=keep).sum().backward()
    torch.testing.assert_close(sinks.grad.double(), s64.grad, atol=1e-5, rtol=1e-5)


VARIANTS = [
    {"softcap": 3.0}, {"sinks": torch.tensor([0.5, -1.0, 2.0, 0.0])},
    {"mask_extra": mh.Mask.alibi(SLOPES)}, {"mask_extra": mh.Mask.window(2)},
]


@pytest.mark.parametrize("variant", VARIANTS, ids=["softcap", "sinks", "alibi", "window"])
@pytest.mark.parametrize("backend", ["math", "sdpa", "varlen", "auto"])
def test_rows_without_keys_are_exact_zeros_with_zero_gradient_under_every_variant(variant, backend):
    variant = dict(variant)
    extra = variant.pop("mask_extra", None)
    mask = mh.Mask.lengths(torch.tensor([0, 5]))
    mask = mask if extra is None else mask & extra
    q, k, v = (t.requires_grad_() for t in _qkv(3))
    try:
        out = mh.attention(q, k, v, mask, backend=backend, **variant)
    except mh.AttentionError as e:  # a backend that cannot compute the variant says so
        assert backend in ("sdpa", "varlen") and "cannot run this call" in str(e)
        return
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    grads = torch.autograd.grad(out.sum(), (q, k, v))
    assert all(torch.equal(g[0], torch.zeros_like(g[0])) for g in grads)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", ["math", "sdpa", "varlen"])
@pytest.mark.parametrize("mask", [mh.Mask.lengths(torch.tensor([4, 7])),
                                  mh.Mask.key_padding(torch.arange(L)[None, :].expand(B, L) >= torch.tensor([[4], [7]]))],
                         ids=["lengths", "key-padding"])
def test_nan_in_a_padded_key_or_value_never_reaches_the_output(mask, backend):
    """One behaviour on every backend: keys no query may see are inert."""
    if backend == "varlen" and mask.normal_form().extents is None:
        pytest.skip("the length-aware backend takes Mask.lengths, not key padding")
    q, k, v = _qkv(4)
    clean = mh.attention(q, k, v, mask, backend="math")
    k2, v2 = k.clone(), v.clone()
    k2[0, :, 4:], v2[0, :, 4:] = float("nan"), float("inf")
    got = mh.attention(q, k2, v2, mask, backend=backend)
    torch.testing.assert_close(got, clean, atol=1e-5, rtol=1e-5)


def test_varlen_with_no_work_still_has_a_gradient():
    q, k, v = (t.requires_grad_() for t in _qkv(5))
    out = mh.attention(q, k, v, mh.Mask.lengths(torch.tensor([0, 0])), backend="varlen")
    assert out.grad_fn is not None and not out.any()
    out.sum().backward()
    assert all(torch.equal(t.grad, torch.zeros_like(t)) for t in (q, k, v))


def test_alibi_sdpa_drops_only_a_per_row_constant():
    """The fused path adds slope * (j - Lk), shape (1, H, 1, Lk), instead of the (Lq, Lk) grid."""
    q, k, v = _qkv(6)
    mask = mh.Mask.alibi(SLOPES) & mh.Mask.causal()
    torch.testing.assert_close(mh.attention(q, k, v, mask, backend="sdpa"),
                               mh.attention(q, k, v, mask, backend="math"), atol=1e-5, rtol=1e-5)
    assert "(1, 4, 1, 7)" in mh.dispatch(q, k, v, mh.Mask.alibi(SLOPES)).detail


def test_masks_are_pytree_nodes_that_round_trip():
    import torch.utils._pytree as pytree

    mask = (mh.Mask.lengths(torch.tensor([3, 7]), query_lens=torch.tensor([2, 7])) & mh.Mask.causal("bottom_right")
            & mh.Mask.window(3) & mh.Mask.alibi(SLOPES) & mh.Mask.segments(IDS) & mh.Mask.additive(torch.zeros(L, L)))
    leaves, spec = pytree.tree_flatten(mask)
    assert all(isinstance(t, torch.Tensor) for t in leaves) and len(leaves) == 6
    again = pytree.tree_unflatten(leaves, spec)
    assert repr(again) == repr(mask)
    keep, bias = mask.materialize(B, H, L, L)
    keep2, bias2 = again.materialize(B, H, L, L)
    assert torch.equal(keep, keep2) and torch.equal(bias, bias2)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_segments_run_one_slice_per_segment(causal):
    """The length-aware backend runs each packed segment alone, and equals the dense path."""
    q, k, v = _qkv(7)
    mask = mh.Mask.segments(IDS) & mh.Mask.causal() if causal else mh.Mask.segments(IDS)
    got = mh.attention(q, k, v, mask, backend="varlen")
    torch.testing.assert_close(got, mh.attention(q, k, v, mask, backend="math"), atol=1e-5, rtol=1e-5)
    assert "5 calls" in mh.dispatch(q, k, v, mask, backend="varlen").detail  # 3 segments + 2 segments


def test_segments_whose_ids_come_back_are_left_to_the_dense_path():
    q, k, v = _qkv(8)
    mask = mh.Mask.segments(torch.tensor([[0, 0, 1, 1, 0, 0, 0], [0] * 7]))
    with pytest.raises(mh.AttentionError, match="more than one run"):
        mh.attention(q, k, v, mask, backend="varlen")
    assert mh.dispatch(q, k, v, mask).backend == "sdpa"


@pytest.mark.parametrize("mask", [None, mh.Mask.key_padding(torch.tensor([[False] * 7, [False] * 4 + [True] * 3])),
                                  mh.Mask.alibi(SLOPES), mh.Mask.lengths(torch.tensor([7, 2])) & mh.Mask.causal("bottom_right")],
                         ids=["none", "key-padding", "alibi", "lengths&bottom-right"])
def test_one_query_with_grouped_heads_reads_each_kv_head_once_and_equals_the_reference(mask):
    """A decode step (Lq = 1) with GQA runs as G query rows per kv head; the values are unchanged."""
    q, k, v = _qkv(9)
    q = q[:, :, -1:]  # (B, H, 1, D)
    got = mh.attention(q, k, v, mask, backend="sdpa")
    torch.testing.assert_close(got, mh.attention(q, k, v, mask, backend="math"), atol=1e-5, rtol=1e-5)
