"""Inputs where torch.nn.MultiheadAttention has its own rules, and mh.compat.MultiheadAttention follows them:
the is_causal hint that discards attn_mask, nested tensors, and a bias of another dtype than the query."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import multihead as mh
from compat_pairs import assert_runs_equal, inputs_for, run, twins
from multihead.compat import CompatAssertionError, MultiheadAttention

E, H, B, L, S = 8, 2, 3, 4, 6
TOL = dict(atol=1e-5, rtol=1e-5)


# --- is_causal=True with need_weights=False and no key_padding_mask: torch drops attn_mask unseen ----------

@pytest.mark.parametrize("attn_mask", [torch.zeros(L, S + 3), torch.zeros(B * H + 1, L, 2, dtype=torch.bool),
                                       torch.randn(L, S)], ids=["wrong 2-D size", "wrong 3-D size", "not causal"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_is_causal_hint_discards_the_mask_before_its_size_is_checked(attn_mask, batch_first):
    theirs, ours = twins(E, H, batch_first=batch_first)
    inputs = inputs_for(B, L, S, E, E, E, batch_first)  # L != S: the causal mask is top-left aligned
    call = dict(attn_mask=attn_mask, is_causal=True, need_weights=False)
    got = run(ours, inputs, **call)
    assert_runs_equal(got, run(theirs, inputs, **call), **TOL)
    causal = torch.ones(L, S, dtype=torch.bool).triu(1)  # True = blocked, as torch's own causal mask
    torch.testing.assert_close(got[0], run(theirs, inputs, attn_mask=causal, need_weights=False)[0], **TOL)


def test_is_causal_hint_still_checks_the_mask_where_torch_uses_it():
    """With need_weights=True or a key_padding_mask torch applies attn_mask itself, so its size counts."""
    _, ours = twins(E, H, batch_first=True)
    q, k, v = inputs_for(B, L, S, E, E, E, True)
    pad = torch.zeros(B, S, dtype=torch.bool)
    for call in (dict(need_weights=True), dict(need_weights=False, key_padding_mask=pad)):
        with pytest.raises(RuntimeError, match="2D attn_mask is .*, but should be"):
            ours(q, k, v, attn_mask=torch.zeros(L, S + 3), is_causal=True, **call)
    # its rank is checked first, always
    with pytest.raises(AssertionError, match="`attn_mask` to be `None`, 2-D or 3-D but found 1-D"):
        ours(q, k, v, attn_mask=torch.zeros(S), is_causal=True, need_weights=False)


# --- nested tensors: where torch sends them ------------------------------------------------------------

def nested(*lengths, layout=torch.strided):
    g = torch.Generator().manual_seed(4)
    return torch.nested.nested_tensor([torch.randn(n, E, generator=g) for n in lengths], layout=layout)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("need_weights", [False, True])
def test_nested_self_attention_on_torchs_fast_path_gives_torchs_result(need_weights):
    """eval, no grad, self-attention, batch_first, an even head count: torch's fused kernel, as torch."""
    theirs, ours = (m.eval() for m in twins(E, H, batch_first=True))
    x = nested(3, 5)
    with torch.no_grad():
        expected, _ = theirs(x, x, x, need_weights=need_weights)
        got, _ = ours(x, x, x, need_weights=need_weights)
    assert got.is_nested
    for a, b in zip(got.unbind(), expected.unbind()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("case", ["empty", "training", "cross-attention", "jagged layout", "odd head count"])
def test_nested_inputs_off_torchs_fast_path_raise_torchs_assertion_error(case):
    heads = 1 if case == "odd head count" else H
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(E, heads, batch_first=True).train(case == "training")
    ours = MultiheadAttention(E, heads, batch_first=True).train(case == "training")
    special = {"empty": torch.nested.nested_tensor([]), "jagged layout": nested(3, 5, layout=torch.jagged)}
    x = special.get(case, nested(3, 5))
    inputs = (x, nested(2, 4), nested(2, 4)) if case == "cross-attention" else (x, x, x)
    with torch.no_grad():
        with pytest.raises(AssertionError) as expected:
            theirs(*inputs)
        with pytest.raises(CompatAssertionError, match="to_padded_tensor") as caught:
            ours(*inputs)
    assert isinstance(caught.value, mh.AttentionError)
    assert str(expected.value) in str(caught.value)  # torch's reason, then how to run it on multihead


# --- a bias of another dtype than the query --------------------------------------------------------------

@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("need_weights", [False, True])
def test_a_half_in_proj_bias_with_a_double_query_is_promoted_as_torch_does(training, need_weights):
    theirs, ours = twins(E, H, batch_first=True, dtype=torch.float64)
    for m in (theirs, ours):
        m.in_proj_bias = nn.Parameter(m.in_proj_bias.detach().half())
        m.train(training)
    for self_attention in (True, False):
        inputs = inputs_for(B, L, S, E, E, E, True, self_attention=self_attention, dtype=torch.float64)
        got = run(ours, inputs, need_weights=need_weights)
        assert got[0].dtype == torch.float64 and got[3]["in_proj_bias"].dtype == torch.float16
        assert_runs_equal(got, run(theirs, inputs, need_weights=need_weights), atol=1e-10, rtol=1e-10)


def test_the_bias_is_promoted_in_the_sequence_first_layout_too():
    """Deliberately wider than torch: torch promotes there only for batch_first=True (it projects a
    transposed view, which takes its promoting matmul path) and raises for batch_first=False."""
    theirs, ours = twins(E, H, dtype=torch.float64)
    for m in (theirs, ours):
        m.in_proj_bias = nn.Parameter(m.in_proj_bias.detach().half())
    q, k, v = inputs_for(B, L, S, E, E, E, False, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="same dtype"):
        theirs(q, k, v)
    expected = nn.MultiheadAttention(E, H, dtype=torch.float64)
    expected.load_state_dict({n: t.double() for n, t in theirs.state_dict().items()})
    torch.testing.assert_close(ours(q, k, v)[0], expected(q, k, v)[0], atol=1e-10, rtol=1e-10)
