"""Mask.sparse: each query keeps only the keys it lists (-1 = none), on every backend, against float64.

The reference is the math backend in float64 under Mask.keep of the same lists, scattered here by hand.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead.errors import AttentionError, CannotRunError
from multihead.masks import Mask

TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


def _qkv(B, H, Hkv, Lq, Lk, D=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, h, L, D, generator=g).to(dtype) for h, L in ((H, Lq), (Hkv, Lk), (Hkv, Lk)))


def _lists(shape, Lk, seed=0, free=0.2):
    """Random key lists with repeats and free slots (-1), one query row listing nothing."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, Lk, shape, generator=g)
    idx = torch.where(torch.rand(shape, generator=g) < free, -1, idx)
    idx[..., 1] = idx[..., 0]  # a key listed twice is kept once
    idx[0, ..., -1, :] = -1  # the last query of row 0 lists nothing
    return idx


def _dense_keep(idx, Lk):
    """(B, 1 or H, Lq, Lk) bool from the lists, by hand."""
    lists = idx[:, None] if idx.dim() == 3 else idx
    keep = torch.zeros(*lists.shape[:-1], Lk + 1, dtype=torch.bool)
    return keep.scatter_(-1, torch.where(lists >= 0, lists, Lk), True)[..., :Lk]


def _reference(q, k, v, idx, extra=None, **kw):
    mask = Mask.keep(_dense_keep(idx, k.shape[2]))
    mask = mask if extra is None else mask & extra
    return mh.attention(q.double(), k.double(), v.double(), mask, backend="math",
                        **{n: (t.double() if isinstance(t, torch.Tensor) else t) for n, t in kw.items()})


def _extras(B, Lk):
    pad = torch.zeros(B, Lk, dtype=torch.bool)
    pad[-1, -5:] = True
    return {"alone": None, "causal": Mask.causal("bottom_right"),
            "causal+padding": Mask.causal("bottom_right") & Mask.key_padding(pad),
            "lengths": Mask.lengths(torch.tensor([Lk] * (B - 1) + [Lk - 7]))}


def test_constructor_and_call_refuse_bad_lists_with_what_came():
    with pytest.raises(AttentionError, match="int32 or int64"):
        Mask.sparse(torch.zeros(1, 2, 3))
    with pytest.raises(AttentionError, match=r"\(B, Lq, K\) or \(B, H, Lq, K\); got \(2, 3\)"):
        Mask.sparse(torch.zeros(2, 3, dtype=torch.long))
    q, k, v = _qkv(2, 4, 2, 3, 10)
    with pytest.raises(AttentionError, match=r"expected \(B=2, Lq=3, K\)"):
        mh.attention(q, k, v, Mask.sparse(torch.zeros(2, 4, 5, dtype=torch.long)))
    with pytest.raises(AttentionError, match=r"\[-1, 10\).*from 10 to 10"):
        mh.attention(q, k, v, Mask.sparse(torch.full((2, 3, 5), 10)))
    with pytest.raises(AttentionError, match="from -2"):
        mh.attention(q, k, v, Mask.sparse(torch.full((2, 3, 5), -2)))
    with pytest.raises(CannotRunError) as refused:
        mh.attention(q, k, v, Mask.causal(), backend="sparse")
    assert refused.value.code == "sparse.no-lists"


COMBINATIONS = [(backend, extra) for backend in ("auto", "sparse", "math", "sdpa", "flex", "banded", "varlen")
                for extra in ("alone", "causal", "causal+padding", "lengths")
                if backend != "flex" or extra in ("alone", "causal+padding")]  # flex: a block mask a call (~1 s)


@pytest.mark.parametrize(("backend", "extra"), COMBINATIONS)
@pytest.mark.parametrize("heads", [False, True])
def test_every_backend_equals_the_float64_reference(backend, extra, heads):
    B, H, Hkv, Lq, Lk = 2, 4, 2, 6, 48
    q, k, v = _qkv(B, H, Hkv, Lq, Lk)
    idx = _lists((B, H, Lq, 8) if heads else (B, Lq, 8), Lk)
    more = _extras(B, Lk)[extra]
    mask = Mask.sparse(idx) if more is None else Mask.sparse(idx) & more
    try:
        with torch.no_grad():
            out = mh.attention(q, k, v, mask, backend=backend)
    except CannotRunError as refused:  # banded needs position terms, varlen a slicing part: said by code
        assert backend in ("banded", "varlen") and refused.code.startswith(backend)
        return
    torch.testing.assert_close(out, _reference(q, k, v, idx, more).float(), atol=TOL[torch.float32], rtol=0)
    assert out[0, :, -1].abs().max() == 0  # the query listing nothing gives exact zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_dtypes_and_autograd_modes(dtype, mode):
    B, H, Hkv, Lq, Lk = 2, 4, 1, 5, 96
    q, k, v = _qkv(B, H, Hkv, Lq, Lk, dtype=dtype)
    idx = _lists((B, Lq, 12), Lk, seed=1)
    mask = Mask.sparse(idx) & Mask.causal("bottom_right")
    ref = _reference(q, k, v, idx, Mask.causal("bottom_right"))
    if mode == "grad":
        q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
        out = mh.attention(q, k, v, mask)
        out.float().square().sum().backward()
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = _reference(q64, k64, v64, idx, Mask.causal("bottom_right"))
        ref.square().sum().backward()
        for t, t64 in ((q, q64), (k, k64), (v, v64)):
            torch.testing.assert_close(t.grad.double(), t64.grad, atol=8 * TOL[dtype], rtol=0)
    else:
        with torch.no_grad() if mode == "no_grad" else torch.inference_mode():
            out = mh.attention(q, k, v, mask)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), ref.detach(), atol=TOL[dtype], rtol=0)


def test_sinks_softcap_and_dropout_free_rows():
    B, H, Hkv, Lq, Lk = 2, 4, 2, 3, 80
    q, k, v = _qkv(B, H, Hkv, Lq, Lk)
    idx = _lists((B, Lq, 10), Lk, seed=2)
    sinks = torch.linspace(-1.0, 1.0, H)
    with torch.no_grad():
        out = mh.attention(q, k, v, Mask.sparse(idx), sinks=sinks, softcap=5.0)
    ref = _reference(q, k, v, idx, sinks=sinks, softcap=5.0)
    torch.testing.assert_close(out.double(), ref, atol=TOL[torch.float32], rtol=0)


@pytest.mark.parametrize("backend", ["auto", "sparse", "math"])
@pytest.mark.parametrize("K", [6, 50])
def test_two_sparse_parts_keep_the_keys_both_list(backend, K):
    """One query of one sequence (its gathered slots are then shaped like a run of keys) under two lists, the
    first of 6 keys or of as many slots as keys, with repeats: the keys both lists name, nothing else."""
    Lk = 50
    q, k, v = _qkv(1, 2, 1, 1, Lk)
    first = torch.randint(0, Lk, (1, 1, K), generator=torch.Generator().manual_seed(0))
    second = _lists((1, 1, 4), Lk, seed=3)
    second[0, 0, 0] = first[0, 0, 0]
    both = _dense_keep(first, Lk) & _dense_keep(second, Lk)
    with torch.no_grad():
        out = mh.attention(q, k, v, Mask.sparse(first) & Mask.sparse(second), backend=backend)
    ref = mh.attention(q.double(), k.double(), v.double(), Mask.keep(both), backend="math")
    torch.testing.assert_close(out.double(), ref, atol=TOL[torch.float32], rtol=0)


def test_long_prefill_gathers_blocks_of_queries_not_the_grid(monkeypatch):
    from multihead.backends import sparse
    B, H, Hkv, Lq, Lk, K = 1, 2, 1, 96, 2304, 16  # within the listed keys auto runs sparse prefills with
    q, k, v = _qkv(B, H, Hkv, Lq, Lk)
    idx = torch.sort(torch.randint(0, Lk, (B, Lq, K), generator=torch.Generator().manual_seed(3)), -1).values
    monkeypatch.setattr(sparse, "GATHER_BUDGET", B * Hkv * K * (16 + 16) * 16)  # 16 queries a block: 6 blocks
    q.requires_grad_()
    d = mh.dispatch(q, k, v, Mask.sparse(idx) & Mask.causal("bottom_right"))
    assert d.backend == "sparse" and "16 queries at a time; softmax" in d.detail
    out = mh.attention(q, k, v, Mask.sparse(idx) & Mask.causal("bottom_right"))
    torch.testing.assert_close(out.double(), _reference(q.detach(), k, v, idx, Mask.causal("bottom_right")),
                               atol=TOL[torch.float32], rtol=0)


def test_decode_step_runs_the_kernel_over_the_listed_rows():
    B, H, Hkv, Lk, K, D = 2, 16, 1, 4096, 256, 128
    q, k, v = _qkv(B, H, Hkv, 1, Lk, D=D, dtype=torch.bfloat16)
    idx = _lists((B, 1, K), Lk, seed=4)
    idx[0, 0, :5] = torch.arange(5)  # row 0 lists a few keys (its last query listed none)
    mask = Mask.sparse(idx) & Mask.causal("bottom_right")
    d = mh.dispatch(q, k, v, mask)
    assert d.backend == "sparse" and ("C++ decode kernel" in d.detail or "plain torch" in d.detail)
    with torch.no_grad():
        out = mh.attention(q, k, v, mask)
    torch.testing.assert_close(out.double(), _reference(q, k, v, idx, Mask.causal("bottom_right")),
                               atol=TOL[torch.bfloat16], rtol=0)


def test_compiles_with_dynamic_shapes_and_gradients():
    B, H, Hkv, Lk = 1, 4, 2, 64
    f = torch.compile(lambda q, k, v, idx: mh.attention(q, k, v, Mask.sparse(idx) & Mask.causal("bottom_right")),
                      dynamic=True, fullgraph=True, backend="eager")
    for Lq in (3, 5):
        q, k, v = _qkv(B, H, Hkv, Lq, Lk, seed=Lq)
        idx = _lists((B, Lq, 7), Lk, seed=Lq)
        q.requires_grad_()
        out = f(q, k, v, idx)
        out.sum().backward()
        q64 = q.detach().double().requires_grad_()
        ref = _reference(q64, k, v, idx, Mask.causal("bottom_right"))
        ref.sum().backward()
        torch.testing.assert_close(out.double(), ref, atol=TOL[torch.float32], rtol=0)
        torch.testing.assert_close(q.grad.double(), q64.grad, atol=1e-4, rtol=0)
    q, idx = q[:, :, -1:].detach(), idx[:, -1:]  # a decode step, no gradient: the decode kernel's custom op
    with torch.no_grad():
        torch.testing.assert_close(f(q, k, v, idx).double(), _reference(q, k, v, idx, Mask.causal("bottom_right")),
                                   atol=TOL[torch.float32], rtol=0)


@settings(max_examples=25, deadline=None)
@given(B=st.integers(1, 2), G=st.sampled_from([1, 2]), Lq=st.integers(1, 5), Lk=st.integers(1, 40),
       K=st.integers(1, 9), heads=st.booleans(), causal=st.booleans(), padded=st.booleans(), seed=st.integers(0, 99))
def test_property_sparse_backend_equals_the_dense_keep(B, G, Lq, Lk, K, heads, causal, padded, seed):
    Hkv = 2
    q, k, v = _qkv(B, Hkv * G, Hkv, Lq, Lk, seed=seed)
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, Lk, (B, Hkv * G, Lq, K) if heads else (B, Lq, K), generator=g)
    more = Mask.causal("bottom_right") if causal else None
    if padded:
        pad = Mask.key_padding(torch.rand(B, Lk, generator=g) < 0.3)
        more = pad if more is None else more & pad
    mask = Mask.sparse(idx) if more is None else Mask.sparse(idx) & more
    with torch.no_grad():
        out = mh.attention(q, k, v, mask, backend="sparse")
    torch.testing.assert_close(out.double(), _reference(q, k, v, idx, more), atol=TOL[torch.float32], rtol=0)


def test_rows_of_a_cache_buffer_view_are_gathered_as_they_are():
    """k and v as a KV cache holds them: views of longer buffers (not contiguous), read in place."""
    B, H, Hkv, Lk, K = 2, 4, 2, 100, 9
    q, k_all, v_all = _qkv(B, H, Hkv, 2, Lk + 28, seed=5)
    k, v = k_all[:, :, :Lk], v_all[:, :, :Lk]
    idx = _lists((B, 2, K), Lk, seed=5)
    with torch.no_grad():
        out = mh.attention(q, k, v, Mask.sparse(idx), backend="sparse")
    torch.testing.assert_close(out.double(), _reference(q, k, v, idx), atol=TOL[torch.float32], rtol=0)
