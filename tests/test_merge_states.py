"""mh.merge_states: the (out, lse) of disjoint key sets put together equal attention over all the keys."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import multihead as mh
from multihead.backends.merge import merge_states


def attend64(q, k, v, keep):
    """Float64 reference: (out (B, H, Lq, Dv), lse (B, H, Lq)); a row keeping no key gives 0 and -inf."""
    s = (q.double() @ k.double().transpose(-2, -1)) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(s, dim=-1)
    w = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0).unsqueeze(-1))
    return w @ v.double(), lse


def split_bounds(n: int, parts: int):
    edges = torch.linspace(0, n, parts + 1).round().long().tolist()
    return list(zip(edges[:-1], edges[1:]))


@pytest.mark.parametrize("parts", [2, 7])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_split_calls_merge_into_the_whole_call(parts, dtype):
    g = torch.Generator().manual_seed(parts)
    B, H, Lq, Lk, D = 2, 3, 5, 2048, 16
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (Lq, Lk, Lk))
    keep = torch.rand(B, 1, Lq, Lk, generator=g) > 0.3
    keep[0, :, 1] = False                                   # a row that keeps no key at all
    whole, whole_lse = attend64(q, k, v, keep)
    states = []
    for lo, hi in split_bounds(Lk, parts):
        o, lse = attend64(q, k[..., lo:hi, :], v[..., lo:hi, :], keep[..., lo:hi])
        states.append((o.to(dtype), lse.float()))
    out, lse = merge_states(states)
    assert out.dtype == dtype and lse.dtype == torch.float32 and out.shape == whole.shape
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-3}[dtype]   # one rounding of out_i
    torch.testing.assert_close(out.double(), whole, atol=tol, rtol=tol)
    torch.testing.assert_close(lse.double(), whole_lse, atol=1e-5, rtol=1e-6)
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1])) and torch.isneginf(lse[0, :, 1]).all()


def test_a_set_a_row_does_not_see_is_never_read():
    """lse = -inf marks a set with no key for that row: its out may hold anything, even NaN."""
    out_a = torch.full((1, 1, 2, 4), float("nan"))
    lse_a = torch.tensor([[[-math.inf, -math.inf]]])
    out_b = torch.ones(1, 1, 2, 4)
    lse_b = torch.tensor([[[0.5, -math.inf]]])
    out, lse = mh.merge_states([(out_a, lse_a), (out_b, lse_b)])
    assert torch.equal(out[0, 0, 0], torch.ones(4)) and torch.equal(out[0, 0, 1], torch.zeros(4))
    assert lse[0, 0, 0] == 0.5 and torch.isneginf(lse[0, 0, 1])


def test_gradients_flow_to_every_state():
    g = torch.Generator().manual_seed(0)
    outs = [torch.randn(1, 2, 3, 4, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]
    lses = [torch.randn(1, 2, 3, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3)]

    def f(*ts):
        o, l = merge_states(list(zip(ts[:3], ts[3:])))
        return o.sum() + l.sum()
    assert torch.autograd.gradcheck(lambda *ts: merge_states(list(zip(ts[:3], ts[3:])))[0], (*outs, *lses))
    f(*outs, *lses).backward()
    assert all(t.grad is not None for t in outs + lses)


def test_compiles_with_dynamic_shapes():
    compiled = torch.compile(merge_states, dynamic=True, fullgraph=True)
    for Lq in (3, 5):
        states = [(torch.randn(2, 2, Lq, 8), torch.randn(2, 2, Lq)) for _ in range(2)]
        out, lse = compiled(states)
        ref_out, ref_lse = merge_states(states)
        torch.testing.assert_close(out, ref_out)
        torch.testing.assert_close(lse, ref_lse)


@settings(max_examples=40, deadline=None)
@given(parts=st.integers(1, 6), Lk=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_any_split_of_any_keys(parts, Lk, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(1, 2, 3, 4, generator=g), torch.randn(1, 2, Lk, 4, generator=g), torch.randn(1, 2, Lk, 4, generator=g)
    keep = torch.rand(1, 1, 3, Lk, generator=g) > 0.5
    whole, whole_lse = attend64(q, k, v, keep)
    cuts = sorted(torch.randint(0, Lk + 1, (parts - 1,), generator=g).tolist())
    edges = [0, *cuts, Lk]
    states = [tuple(t for t in attend64(q, k[..., a:b, :], v[..., a:b, :], keep[..., a:b])) for a, b in zip(edges, edges[1:])]
    out, lse = merge_states(states)
    torch.testing.assert_close(out, whole, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(lse.double(), whole_lse, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("states, says", [
    ([], "non-empty"),
    ((torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2)), "one pair"),
    ([(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 3))], "expected out (B, H, Lq, Dv) and lse (B, H, Lq)"),
    ([(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2)), (torch.zeros(1, 1, 2, 5), torch.zeros(1, 1, 2))], "must match"),
    ([(torch.zeros(1, 1, 2, 4),)], "pair (out, lse)"),
    ([(torch.zeros(1, 1, 2, 4), torch.zeros(1, 1, 2, dtype=torch.long))], "expected floats"),
])
def test_bad_states_say_what_was_expected(states, says):
    with pytest.raises(mh.AttentionError, match=None) as info:
        mh.merge_states(states)
    assert says in str(info.value)
