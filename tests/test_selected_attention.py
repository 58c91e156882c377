"""attend_selected: each query attends to its listed keys only (Mask.sparse), gathered, the C++ step and dense."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
import multihead.backends.sparse as sparse_backend
from multihead.layers.selected_attention import attend_selected, restrict_indices


def random_selection(B, Lq, Lk, K, seed, free=0.25):
    """(B, Lq, K) distinct keys per row, about `free` of the slots -1."""
    g = torch.Generator().manual_seed(seed)
    picks = torch.stack([torch.randperm(Lk, generator=g)[:K] for _ in range(B * Lq)]).view(B, Lq, K)
    return torch.where(torch.rand(B, Lq, K, generator=g) < free, -1, picks)


def reference(q, k, v, indices, sinks=None):
    """float64 softmax over the listed keys (and the sink), written out: (B, H, Lq, Dv)."""
    B, H, Lq, D = q.shape
    groups = H // k.shape[1]
    keep = torch.zeros(B, Lq, k.shape[2] + 1, dtype=torch.bool).scatter_(-1, indices.clamp(min=-1) % (k.shape[2] + 1),
                                                                       True)[..., :-1]
    s = (q.double() @ k.double().repeat_interleave(groups, 1).transpose(-1, -2)) * D ** -0.5  # (B, H, Lq, Lk)
    s = s.masked_fill(~keep[:, None], float("-inf"))
    if sinks is not None:
        s = torch.cat((s, sinks.double().view(1, H, 1, 1).expand(B, H, Lq, 1)), dim=-1)
    p = torch.nan_to_num(s.softmax(-1))[..., :k.shape[2]]
    return p @ v.double().repeat_interleave(groups, 1)


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 2), Hkv=st.sampled_from([1, 2]), groups=st.sampled_from([1, 3]), Lq=st.integers(1, 6),
       Lk=st.integers(1, 12), K=st.integers(0, 5), sinks=st.booleans(), seed=st.integers(0, 99))
def test_both_forms_equal_the_softmax_over_the_listed_keys_fp32(B, Hkv, groups, Lq, Lk, K, sinks, seed):
    K = min(K, Lk)
    torch.manual_seed(seed)
    H = Hkv * groups
    q, k, v = torch.randn(B, H, Lq, 8), torch.randn(B, Hkv, Lk, 8), torch.randn(B, Hkv, Lk, 5)
    s = torch.randn(H) if sinks else None
    indices = random_selection(B, Lq, Lk, K, seed)
    expected = reference(q, k, v, indices, s)
    torch.testing.assert_close(attend_selected(q, k, v, indices, sinks=s).double(), expected, rtol=1e-5, atol=1e-5)
    if Lk:  # the dense keep (math) and the gathered rows, one query per block, with and without a gradient
        torch.testing.assert_close(attend_selected(q, k, v, indices, sinks=s, backend="math").double(), expected,
                                   rtol=1e-5, atol=1e-5)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sparse_backend, "GATHER_BUDGET", 1)
            for grad in (False, True):
                with torch.set_grad_enabled(grad):
                    out = attend_selected(q.requires_grad_(grad), k, v, indices, sinks=s, backend="sparse")
                torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("Lq", [1, 40])  # a step, a prefill
def test_gradients_match_float64_and_free_rows_are_zero(Lq):
    torch.manual_seed(0)
    B, H, Lk, K = 2, 4, 64, 6
    q, k, v = (torch.randn(B, h, n, 8, dtype=torch.float64, requires_grad=True) for h, n in ((H, Lq), (1, Lk), (1, Lk)))
    s = torch.randn(H, dtype=torch.float64, requires_grad=True)
    indices = random_selection(B, Lq, Lk, K, 1)
    indices[0, 0] = -1  # a row with no key
    out = attend_selected(q, k, v, indices, sinks=s)
    assert torch.equal(out[0, :, 0], torch.zeros_like(out[0, :, 0]))
    expected = reference(q, k, v, indices, s)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), (q, k, v, s))
    for got, want in zip(grads, torch.autograd.grad(expected.square().sum(), (q, k, v, s))):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_a_decode_step_reads_only_the_selected_rows():
    """NaN in every key no query lists never reaches the output: the step gathered the listed rows."""
    torch.manual_seed(0)
    k, v = torch.full((1, 1, 4096, 8), float("nan")), torch.full((1, 1, 4096, 8), float("nan"))
    listed = torch.tensor([[[5, 700, 4000, -1]]])
    k[..., [5, 700, 4000], :], v[..., [5, 700, 4000], :] = torch.randn(3, 8), torch.randn(3, 8)
    q = torch.randn(1, 4, 1, 8)
    out = attend_selected(q, k, v, listed)
    torch.testing.assert_close(out.double(), reference(q, torch.nan_to_num(k), torch.nan_to_num(v), listed))


def test_bf16_stays_within_twice_the_drift_of_a_bf16_dense_reference():
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 30, 16), torch.randn(2, 2, 30, 16), torch.randn(2, 2, 30, 16)
    indices = random_selection(2, 30, 30, 8, 3, free=0.0)
    exact = reference(q, k, v, indices)
    keep = torch.zeros(2, 1, 30, 30, dtype=torch.bool).scatter_(-1, indices[:, None], True)
    dense = mh.attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mh.Mask.keep(keep))
    drift = (dense.double() - exact).abs().max().item()
    for step in (slice(0, 30), slice(29, 30)):  # a prefill and a step
        out = attend_selected(q[:, :, step].bfloat16(), k.bfloat16(), v.bfloat16(), indices[:, step])
        assert (out.double() - exact[:, :, step]).abs().max().item() <= 2 * drift + 1e-3


def test_restrict_indices_drops_what_the_mask_forbids():
    indices = torch.tensor([[[0, 2, -1], [1, 3, 0]]])
    allowed = torch.tensor([[[True, False, True, True], [True, True, True, False]]])
    assert restrict_indices(indices, allowed).tolist() == [[[0, 2, -1], [1, -1, 0]]]
    assert restrict_indices(indices, None) is indices


@pytest.mark.parametrize("indices,message", [
    (torch.zeros(2, 3, 2), "int32 or int64"),
    (torch.zeros(2, 4, 2, dtype=torch.long), r"must be \(B=2, Lq=3, K\)"),
    (torch.full((2, 3, 2), 9), r"must lie in \[-1, 9\)"),
    (torch.full((2, 3, 2), -2), "from -2 to -2"),
])
def test_bad_indices_are_refused(indices, message):
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 1, 9, 8)
    with pytest.raises(mh.AttentionError, match=message):
        attend_selected(q, k, k, indices)
