"""Properties that hold for any inputs (hypothesis): what attention must never do."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh

BACKENDS = st.sampled_from(["math", "sdpa"])


@st.composite
def problems(draw):
    B, Hkv = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    H = Hkv * draw(st.integers(1, 2))
    Lq, Lk, D = draw(st.integers(1, 6)), draw(st.integers(1, 6)), draw(st.integers(1, 8))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    q = torch.randn(B, H, Lq, D, generator=g)
    k = torch.randn(B, Hkv, Lk, D, generator=g)
    v = torch.randn(B, Hkv, Lk, D, generator=g)
    return q, k, v, g


SETTINGS = settings(max_examples=40, deadline=None)


@SETTINGS
@given(problems(), BACKENDS)
def test_masked_out_keys_and_values_are_inert(problem, backend):
    q, k, v, g = problem
    B, Lk = k.shape[0], k.shape[2]
    lens = torch.randint(0, Lk + 1, (B,), generator=g)
    blocked = (torch.arange(Lk) >= lens[:, None])[:, None, :, None]  # (B, 1, Lk, 1)
    mask = mh.Mask.lengths(lens)
    k2 = torch.where(blocked, torch.randn(k.shape, generator=g) * 100, k)
    v2 = torch.where(blocked, torch.randn(v.shape, generator=g) * 100, v)
    assert torch.allclose(mh.attention(q, k, v, mask, backend=backend),
                          mh.attention(q, k2, v2, mask, backend=backend), atol=1e-5)


@SETTINGS
@given(problems(), BACKENDS)
def test_batch_elements_are_independent(problem, backend):
    q, k, v, g = problem
    out = mh.attention(q, k, v, backend=backend)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[1:] = torch.randn(t[1:].shape, generator=g)
    assert torch.allclose(out[:1], mh.attention(q2, k2, v2, backend=backend)[:1], atol=1e-5)


@SETTINGS
@given(problems(), BACKENDS, st.sampled_from(["top_left", "bottom_right"]))
def test_causal_outputs_never_depend_on_the_future(problem, backend, align):
    q, k, v, g = problem
    Lq, Lk = q.shape[2], k.shape[2]
    mask = mh.Mask.causal(align)
    out = mh.attention(q, k, v, mask, backend=backend)
    offset = 0 if align == "top_left" else Lk - Lq
    for i in range(Lq):
        future = i + offset + 1  # keys from here on are in query i's future
        if future >= Lk:
            continue
        k2, v2 = k.clone(), v.clone()
        k2[:, :, future:] = torch.randn(k2[:, :, future:].shape, generator=g)
        v2[:, :, future:] = torch.randn(v2[:, :, future:].shape, generator=g)
        assert torch.allclose(out[:, :, i], mh.attention(q, k2, v2, mask, backend=backend)[:, :, i], atol=1e-5)


@SETTINGS
@given(problems(), BACKENDS)
def test_equivariant_under_query_permutation(problem, backend):
    q, k, v, g = problem
    perm = torch.randperm(q.shape[2], generator=g)
    pad = torch.rand(k.shape[0], k.shape[2], generator=g) > 0.5
    mask = mh.Mask.key_padding(pad)  # a key-only mask: permuting queries must permute outputs
    out = mh.attention(q, k, v, mask, backend=backend)
    assert torch.allclose(out[:, :, perm], mh.attention(q[:, :, perm], k, v, mask, backend=backend), atol=1e-5)


@SETTINGS
@given(problems())
def test_backends_agree(problem):
    q, k, v, g = problem
    keep = torch.rand(q.shape[0], 1, q.shape[2], k.shape[2], generator=g) > 0.4
    mask = mh.Mask.keep(keep)
    assert torch.allclose(mh.attention(q, k, v, mask, backend="math"),
                          mh.attention(q, k, v, mask, backend="sdpa"), atol=1e-5)
