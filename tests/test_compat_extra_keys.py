"""add_bias_kv and add_zero_attn in mh.compat.MultiheadAttention, against torch.nn.MultiheadAttention:
parameters and state dicts, outputs, weights and gradients with every mask kind, both layouts,
kdim/vdim, train and eval, and half precision."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from compat_pairs import assert_runs_equal, inputs_for, run, twins
from helpers import max_abs_diff
import multihead as mh
from multihead.compat import MultiheadAttention

# torch warns when one call mixes a bool and a float mask; these tests mix them on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")

E, H, B, L, S = 12, 3, 2, 4, 5
TOL = dict(atol=2e-5, rtol=2e-5)
EXTRAS = [dict(add_bias_kv=True), dict(add_zero_attn=True), dict(add_bias_kv=True, add_zero_attn=True)]
EXTRA_IDS = ["bias_kv", "zero_attn", "both"]


def masks(kind: str, unbatched: bool = False):
    """(attn_mask, key_padding_mask) over (B, L, S) of one kind; no query loses every real key."""
    g = torch.Generator().manual_seed(5)
    block = torch.rand(L, S, generator=g) > 0.6
    block[:, 0] = False
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, -2:] = True
    heads = H if unbatched else B * H
    if unbatched:
        pad = pad[1]
    return {
        "none": (None, None),
        "bool attn_mask": (block, None),
        "float 3-D attn_mask": (torch.randn(heads, L, S, generator=g), None),
        "bool key padding": (None, pad),
        "float key padding": (None, torch.zeros(pad.shape).masked_fill(pad, float("-inf"))),
        "both": (block.expand(heads, L, S).clone(), pad),
    }[kind]


@pytest.mark.parametrize("extra", EXTRAS, ids=EXTRA_IDS)
def test_parameters_and_state_dict_keys_are_torchs(extra):
    theirs, ours = twins(E, H, **extra)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert list(ours.state_dict()) == list(theirs.state_dict())
    assert ("bias_k" in ours.state_dict()) == extra.get("add_bias_kv", False)
    assert ours.add_zero_attn == extra.get("add_zero_attn", False)
    back = nn.MultiheadAttention(E, H, **extra)
    back.load_state_dict(ours.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), theirs.state_dict().values()))


@pytest.mark.parametrize("extra", EXTRAS, ids=EXTRA_IDS)
@pytest.mark.parametrize("kind, batch_first", [
    ("none", False), ("bool attn_mask", True), ("float 3-D attn_mask", False),
    ("bool key padding", True), ("float key padding", False), ("both", True)])
def test_outputs_weights_and_gradients_equal_torchs(extra, kind, batch_first):
    theirs, ours = twins(E, H, batch_first=batch_first, **extra)
    attn_mask, pad = masks(kind)
    inputs = inputs_for(B, L, S, E, E, E, batch_first)
    for need_weights, average in [(False, True), (True, True), (True, False)]:
        call = dict(key_padding_mask=pad, attn_mask=attn_mask, need_weights=need_weights,
                    average_attn_weights=average)
        got, expected = run(ours, inputs, **call), run(theirs, inputs, **call)
        assert_runs_equal(got, expected, **TOL)
        if need_weights:
            extra_keys = extra.get("add_bias_kv", False) + extra.get("add_zero_attn", False)
            assert got[1].shape[-1] == S + extra_keys  # the weights cover the extra keys too


@pytest.mark.parametrize("extra", EXTRAS, ids=EXTRA_IDS)
@pytest.mark.parametrize("training", [True, False])
def test_separate_kdim_vdim_self_attention_and_unbatched_in_train_and_eval(extra, training):
    theirs, ours = twins(E, H, kdim=7, vdim=9, **extra)
    theirs.train(training), ours.train(training)
    call = dict(need_weights=True, average_attn_weights=False)
    assert_runs_equal(run(ours, inputs_for(B, L, S, E, 7, 9, False), **call),
                      run(theirs, inputs_for(B, L, S, E, 7, 9, False), **call), **TOL)
    # torch's own module tests: unbatched, 3-D (H, L, S) attn_mask and a (S,) key padding mask
    theirs, ours = twins(E, H, batch_first=True, dropout=0.5, **extra)
    theirs.train(training), ours.train(training)
    attn_mask, pad = masks("both", unbatched=True)
    inputs = inputs_for(B, L, L, E, E, E, True, unbatched=True, self_attention=True)
    call = dict(attn_mask=attn_mask[:, :, :L], key_padding_mask=pad[:L])
    if training:  # dropout draws differ between the two; eval turns it off
        out, weights = ours(*inputs, **call)
        extra_keys = extra.get("add_bias_kv", False) + extra.get("add_zero_attn", False)
        assert out.shape == (L, E) and weights.shape == (L, L + extra_keys)
        return
    assert_runs_equal(run(ours, inputs, **call), run(theirs, inputs, **call), **TOL)


@pytest.mark.parametrize("extra", EXTRAS, ids=EXTRA_IDS)
@pytest.mark.parametrize("need_weights", [False, True])
def test_is_causal_hint_sees_the_extra_keys_as_torch_does(extra, need_weights):
    """With the hint and need_weights=False torch uses its own top-left causal mask over all S + n keys
    (so early queries never see the appended keys); with need_weights=True the padded mask, which does."""
    theirs, ours = twins(E, H, batch_first=True, **extra)
    inputs = inputs_for(B, L, L, E, E, E, True, self_attention=True)
    causal = nn.Transformer.generate_square_subsequent_mask(L)
    call = dict(attn_mask=causal, is_causal=True, need_weights=need_weights)
    assert_runs_equal(run(ours, inputs, **call), run(theirs, inputs, **call), **TOL)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("need_weights", [False, True])
def test_half_precision_drifts_from_float64_no_more_than_torch(dtype, need_weights):
    """Both in `dtype` against torch in float64: our error is at most 2x torch's (plus one rounding step)."""
    extra = dict(add_bias_kv=True, add_zero_attn=True)
    theirs64, _ = twins(E, H, batch_first=True, dtype=torch.float64, **extra)
    theirs, ours = (nn.MultiheadAttention(E, H, batch_first=True, dtype=dtype, **extra),
                    MultiheadAttention(E, H, batch_first=True, dtype=dtype, **extra))
    theirs.load_state_dict(theirs64.state_dict()), ours.load_state_dict(theirs64.state_dict())
    attn_mask, pad = masks("both")
    inputs64 = inputs_for(B, L, S, E, E, E, True, dtype=torch.float64)
    call = dict(key_padding_mask=pad, attn_mask=attn_mask[:, :, :S], need_weights=need_weights)
    reference = run(theirs64, inputs64, **call)
    low = [t.to(dtype) for t in inputs64]
    got, expected = run(ours, low, **call), run(theirs, low, **call)
    assert got[0].dtype == expected[0].dtype == dtype
    eps = torch.finfo(dtype).eps
    pairs = [(got[0], expected[0], reference[0])] + list(zip(got[2], expected[2], reference[2]))
    pairs += [(got[3][n], expected[3][n], reference[3][n]) for n in reference[3]]
    if need_weights:
        pairs.append((got[1], expected[1], reference[1]))
    for ours_t, torch_t, ref in pairs:
        allowed = 2 * max_abs_diff(torch_t, ref) + eps * ref.abs().max().item()
        assert max_abs_diff(ours_t, ref) <= allowed


def test_the_core_converter_refuses_extra_keys_and_points_to_the_drop_in():
    """MultiHeadAttention has no extra keys: converting or loading such a module names the drop-in, which loads it."""
    theirs, _ = twins(E, H, add_bias_kv=True, add_zero_attn=True)
    with pytest.raises(mh.AttentionError, match="multihead.compat.MultiheadAttention"):
        mh.MultiHeadAttention.from_module(theirs)
    with pytest.raises(mh.AttentionError, match="multihead.compat.MultiheadAttention"):
        mh.MultiHeadAttention(E, H).load_state_dict(theirs.state_dict())
    MultiheadAttention(E, H, add_bias_kv=True, add_zero_attn=True).load_state_dict(theirs.state_dict())
