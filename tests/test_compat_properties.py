"""Property test: for any combination of constructor options, layouts and masks, mh.compat.MultiheadAttention
gives torch.nn.MultiheadAttention's outputs, weights and gradients."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from compat_pairs import assert_runs_equal, inputs_for, run, twins

pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")

E, H = 8, 2


@st.composite
def calls(draw):
    """(constructor kwargs, sizes, call kwargs) for one call torch accepts without an all-blocked query."""
    ctor = dict(add_bias_kv=draw(st.booleans()), add_zero_attn=draw(st.booleans()), bias=draw(st.booleans()),
                batch_first=draw(st.booleans()))
    if draw(st.booleans()):
        ctor.update(kdim=draw(st.integers(1, 6)), vdim=draw(st.integers(1, 6)))
    unbatched = draw(st.booleans())
    B, L = (1 if unbatched else draw(st.integers(1, 3))), draw(st.integers(1, 4))
    is_causal = draw(st.booleans())
    S = L if is_causal else draw(st.integers(1, 5))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    heads = H if unbatched else B * H
    attn_kind = draw(st.sampled_from(["none", "bool 2-D", "float 2-D", "bool 3-D", "float 3-D"]))
    if is_causal:
        attn_kind = draw(st.sampled_from(["bool 2-D", "float 2-D"]))
    shape = (L, S) if "2-D" in attn_kind else (heads, L, S)
    attn_mask = None
    if attn_kind != "none":
        block = torch.rand(shape, generator=g) > 0.6
        block[..., 0] = False  # every query keeps key 0
        if is_causal:
            block = torch.ones(L, S, dtype=torch.bool).triu(1)
        attn_mask = block if "bool" in attn_kind else torch.zeros(shape).masked_fill(block, float("-inf"))
    pad = None
    if draw(st.booleans()):
        pad = torch.rand((S,) if unbatched else (B, S), generator=g) > 0.7
        pad[..., 0] = False
        if draw(st.booleans()):
            pad = torch.zeros(pad.shape).masked_fill(pad, float("-inf"))
    call = dict(key_padding_mask=pad, attn_mask=attn_mask, need_weights=draw(st.booleans()),
                average_attn_weights=draw(st.booleans()), is_causal=is_causal)
    return ctor, (B, L, S, unbatched, draw(st.booleans())), call


@settings(max_examples=30, deadline=None)
@given(calls(), st.booleans())
def test_any_combination_equals_torch(example, training):
    ctor, (B, L, S, unbatched, self_attention), call = example
    theirs, ours = twins(E, H, **ctor)
    theirs.train(training), ours.train(training)
    kdim, vdim = ctor.get("kdim", E), ctor.get("vdim", E)
    self_attention = self_attention and kdim == vdim == E and L == S
    inputs = inputs_for(B, L, S, E, kdim, vdim, ctor["batch_first"], unbatched=unbatched, self_attention=self_attention)
    assert_runs_equal(run(ours, inputs, **call), run(theirs, inputs, **call), atol=2e-5, rtol=2e-5)
