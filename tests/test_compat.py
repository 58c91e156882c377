"""mh.compat.MultiheadAttention against torch.nn.MultiheadAttention itself: signature, parameters,
state dicts and every call convention."""
from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

import multihead as mh
from compat_pairs import assert_runs_equal, inputs_for, run, twins
from multihead.compat import MultiheadAttention

# torch warns when one call mixes a bool and a float mask; these tests mix them on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")

E, H, L, S, B = 16, 4, 5, 7, 3
TOL = dict(atol=1e-5, rtol=1e-5)


def pair(seed: int = 0, **kwargs):
    """(torch's module, ours) built from the same seed: the same initial parameters."""
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(E, H, **kwargs)
    torch.manual_seed(seed)
    ours = MultiheadAttention(E, H, **kwargs)
    return theirs, ours


def test_constructor_and_call_signatures_are_torchs():
    for name in ("__init__", "forward"):
        ours = inspect.signature(getattr(MultiheadAttention, name)).parameters
        theirs = inspect.signature(getattr(nn.MultiheadAttention, name)).parameters
        assert [(p.name, p.default) for p in ours.values()] == [(p.name, p.default) for p in theirs.values()]


@pytest.mark.parametrize("kwargs", [{}, {"bias": False}, {"kdim": 6, "vdim": 10}])
def test_same_parameters_and_state_dicts_load_both_ways(kwargs):
    theirs, ours = pair(**kwargs)
    assert isinstance(ours, nn.MultiheadAttention)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    for (name, a), b in zip(theirs.state_dict().items(), ours.state_dict().values()):
        assert torch.equal(a, b), name
    fresh = MultiheadAttention(E, H, **kwargs)
    fresh.load_state_dict(theirs.state_dict())
    back = nn.MultiheadAttention(E, H, **kwargs)
    back.load_state_dict(fresh.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), theirs.state_dict().values()))


def masks(kind: str):
    """(attn_mask, key_padding_mask, is_causal) for (B, L, S) with L == S when causal; no empty rows."""
    g = torch.Generator().manual_seed(3)
    block = torch.rand(L, S, generator=g) > 0.6
    block[:, 0] = False  # every query keeps key 0
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, -3:] = True
    causal = nn.Transformer.generate_square_subsequent_mask(L)  # float, -inf above the diagonal
    return {
        "none": (None, None, False),
        "bool attn_mask": (block, None, False),
        "float attn_mask": (torch.randn(L, S, generator=g), None, False),
        "3-D attn_mask": (block.expand(B * H, L, S).clone(), None, False),
        "bool key padding": (None, pad, False),
        "float key padding": (None, torch.zeros(B, S).masked_fill(pad, float("-inf")), False),
        "both, mixed types": (torch.randn(L, S, generator=g), pad, False),
        "is_causal hint": (causal, None, True),
        "is_causal hint + padding": (causal, pad, True),
    }[kind]


MASK_KINDS = ["none", "bool attn_mask", "float attn_mask", "3-D attn_mask", "bool key padding",
              "float key padding", "both, mixed types", "is_causal hint", "is_causal hint + padding"]


@pytest.mark.parametrize("kind", MASK_KINDS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("need_weights,average", [(False, True), (True, True), (True, False)])
def test_outputs_weights_and_gradients_equal_torchs(kind, batch_first, need_weights, average):
    theirs, ours = twins(E, H, batch_first=batch_first)
    attn_mask, pad, is_causal = masks(kind)
    Lk = L if is_causal else S
    if is_causal and pad is not None:
        pad = pad[:, :Lk]
    inputs = inputs_for(B, L, Lk, E, E, E, batch_first)
    inputs = (inputs[0], inputs[1], inputs[1])  # key is value: torch's encoder-decoder projection
    call = dict(key_padding_mask=pad, need_weights=need_weights, attn_mask=attn_mask, average_attn_weights=average,
                is_causal=is_causal)
    assert_runs_equal(run(ours, inputs, **call), run(theirs, inputs, **call), **TOL)


@pytest.mark.parametrize("need_weights", [False, True])
def test_unbatched_inputs_separate_kdim_vdim_and_no_bias(need_weights):
    theirs, ours = twins(E, H, kdim=6, vdim=10, bias=False)
    q, k, v = torch.randn(L, E), torch.randn(S, 6), torch.randn(S, 10)
    pad = torch.tensor([False] * (S - 2) + [True] * 2)
    attn_mask = torch.randn(H, L, S)
    expected = theirs(q, k, v, key_padding_mask=pad, attn_mask=attn_mask, need_weights=need_weights,
                      average_attn_weights=False)
    got = ours(q, k, v, key_padding_mask=pad, attn_mask=attn_mask, need_weights=need_weights,
               average_attn_weights=False)
    torch.testing.assert_close(got[0], expected[0], **TOL)
    if need_weights:
        assert got[1].shape == (H, L, S)
        torch.testing.assert_close(got[1], expected[1], **TOL)


def test_a_query_with_every_key_blocked_gives_zero_on_both_paths():
    """torch gives 0 there with need_weights=False (SDPA) but NaN with need_weights=True; ours gives 0."""
    theirs, ours = twins(E, H, batch_first=True)
    x = torch.randn(B, L, E)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[2] = True  # every key of sequence 2 is padding
    fast, _ = theirs(x, x, x, key_padding_mask=pad, need_weights=False)
    slow, slow_weights = theirs(x, x, x, key_padding_mask=pad)
    assert torch.isnan(slow[2]).all() and torch.isnan(slow_weights[2]).all()
    for need_weights in (False, True):
        got, weights = ours(x, x, x, key_padding_mask=pad, need_weights=need_weights)
        torch.testing.assert_close(got[2], ours.out_proj.bias.expand(L, E), atol=0, rtol=0)  # out_proj(0)
        torch.testing.assert_close(got, fast, **TOL)
        assert weights is None or torch.equal(weights[2], torch.zeros(L, L))


def test_attention_runs_on_multiheads_backends():
    _, ours = twins(E, H, batch_first=True)
    x = torch.randn(B, L, E)
    with mh.capture_attention() as record:
        ours(x, x, x, need_weights=False)
    assert len(record) == 1 and record[0].weights.shape == (B, H, L, L)


@pytest.mark.parametrize("make, expected", [
    (lambda: MultiheadAttention(E, 3), "divisible"),
    (lambda: MultiheadAttention(0, H), "positive int"),
])
def test_bad_construction_raises(make, expected):
    with pytest.raises(mh.AttentionError, match=expected):
        make()
