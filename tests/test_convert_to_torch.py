"""to_torch: MultiHeadAttention -> torch.nn.MultiheadAttention with the same outputs, or a reason why not."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import multihead as mh
from helpers import assert_same_forward_backward
from multihead.convert.to_torch import to_torch

B, LQ, LK, E, H = 2, 4, 6, 12, 3


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def randomised(mod):
    """Random (not initial) weights and biases, float64, so that every bias matters."""
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_()
    return mod.double()


@pytest.mark.parametrize("batch_first", [True, False])
@pytest.mark.parametrize("dims", [{}, {"kdim": 5, "vdim": 7}])
@pytest.mark.parametrize("bias", [True, False, {"q": False, "k": False}, {"out": False}])
def test_to_torch_gives_the_same_outputs(batch_first, dims, bias):
    ours = randomised(mh.MultiHeadAttention(E, H, bias=bias, batch_first=batch_first, **dims)).eval()
    theirs = to_torch(ours)
    assert isinstance(theirs, nn.MultiheadAttention) and not theirs.training
    assert (theirs.batch_first, theirs.num_heads, theirs.kdim, theirs.vdim) == (batch_first, H, ours.kdim, ours.vdim)
    pad = torch.tensor([[False] * LK, [False] * 2 + [True] * (LK - 2)])  # (B, Lk), True = padding
    blocked = torch.rand(LQ, LK) < 0.3
    blocked[:, 0] = False  # every query keeps a key
    shape = (lambda b, l, f: (b, l, f)) if batch_first else (lambda b, l, f: (l, b, f))
    inputs = [torch.randn(shape(B, length, features), dtype=torch.float64)
              for length, features in ((LQ, E), (LK, ours.kdim), (LK, ours.vdim))]
    assert_same_forward_backward(
        lambda q, k, v: theirs(q, k, v, key_padding_mask=pad, attn_mask=blocked, need_weights=False)[0],
        lambda q, k, v: ours(q, k, v, mask=mh.Mask.key_padding(pad) & mh.Mask.block(blocked)), inputs)


def test_round_trip_through_torch_and_back():
    ours = randomised(mh.MultiHeadAttention(E, H, dropout=0.1))
    back = mh.MultiHeadAttention.from_module(ours.to_torch())  # the method is this module's function
    assert back.dropout == 0.1
    for name, param in ours.named_parameters():
        torch.testing.assert_close(back.get_parameter(name), param)


@pytest.mark.parametrize("kwargs, match", [
    ({"num_kv_heads": 1}, "GQA"),
    ({"head_dim": 8}, "not embed_dim=12"),
    ({"out_dim": 5}, "out_dim=5"),
    ({"causal": True}, "causal on every call"),
])
def test_to_torch_says_why_it_cannot(kwargs, match):
    with pytest.raises(mh.AttentionError, match=match):
        to_torch(mh.MultiHeadAttention(E, H, **kwargs))


def test_to_torch_rejects_other_modules():
    with pytest.raises(mh.AttentionError, match="expects a multihead.MultiHeadAttention; got Linear"):
        to_torch(nn.Linear(E, E))


@pytest.mark.parametrize("option", [{"rope": mh.RoPE(4)}, {"window": 3}, {"alibi": True}, {"softcap": 5.0},
                                    {"sinks": True}, {"qk_norm": True}, {"scale": 0.3}],
                         ids=["rope", "window", "alibi", "softcap", "sinks", "qk_norm", "scale"])
def test_decoder_variants_are_refused_with_their_names(option):
    name = next(iter(option))
    with pytest.raises(mh.AttentionError, match=f"it uses {name}, which nn.MultiheadAttention does not compute"):
        to_torch(mh.MultiHeadAttention(16, 4, **option))
