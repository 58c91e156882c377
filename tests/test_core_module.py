"""MultiHeadAttention: layouts, projections, GQA, and parity with torch.nn.MultiheadAttention."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import multihead as mh
from helpers import max_abs_diff, reference_attention


def module_reference(mod: mh.MultiHeadAttention, query, key, value, keep=None):
    """The module's function in float64 from its own weights, batch-first (B, L, features)."""
    H, Hkv, D = mod.num_heads, mod.num_kv_heads, mod.head_dim

    def project(x, proj, heads):
        w = proj.weight.double()
        y = x.double() @ w.T + (0 if proj.bias is None else proj.bias.double())
        return y.view(x.shape[0], x.shape[1], heads, D).transpose(1, 2)  # (B, heads, L, D)

    out = reference_attention(project(query, mod.q_proj, H), project(key, mod.k_proj, Hkv),
                              project(value, mod.v_proj, Hkv), keep)
    out = out.transpose(1, 2).reshape(query.shape[0], query.shape[1], H * D)
    return out @ mod.out_proj.weight.double().T + (0 if mod.out_proj.bias is None else mod.out_proj.bias.double())


CONFIGS = [
    dict(embed_dim=12, num_heads=3),
    dict(embed_dim=12, num_heads=4, kdim=5, vdim=7),
    dict(embed_dim=6, num_heads=2, head_dim=5, out_dim=9),  # d2l-style: inner width 10 != embed_dim
    dict(embed_dim=16, num_heads=4, num_kv_heads=2),  # GQA
    dict(embed_dim=16, num_heads=4, num_kv_heads=1, bias={"q": False, "k": False}),  # MQA, labml biases
    dict(embed_dim=8, num_heads=2, bias=False),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
@pytest.mark.parametrize("batch_first", (True, False))
def test_module_matches_float64_reference(config, batch_first):
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(**config, batch_first=batch_first)
    B, Lq, Lk = 3, 5, 7
    query = torch.randn(B, Lq, config["embed_dim"])
    key = torch.randn(B, Lk, config.get("kdim", config["embed_dim"]))
    value = torch.randn(B, Lk, config.get("vdim", config["embed_dim"]))
    lens = torch.tensor([7, 1, 4])
    expected = module_reference(mod, query, key, value, (torch.arange(Lk) < lens[:, None])[:, None, None])
    to_layout = (lambda t: t) if batch_first else (lambda t: t.transpose(0, 1))
    out = mod(to_layout(query), to_layout(key), to_layout(value), mask=mh.Mask.lengths(lens))
    assert max_abs_diff(to_layout(out), expected) < 1e-5
    assert out.shape == to_layout(expected).shape


def test_self_attention_defaults_and_unbatched_input():
    mod = mh.MultiHeadAttention(8, 2)
    x = torch.randn(2, 4, 8)
    assert torch.equal(mod(x), mod(x, x, x))
    assert torch.allclose(mod(x[0]), mod(x)[0], atol=1e-6)


def test_projection_shapes_and_bias_dict():
    mod = mh.MultiHeadAttention(16, 4, kdim=3, vdim=5, head_dim=6, num_kv_heads=2, out_dim=7,
                                bias={"q": False, "out": False})
    assert mod.q_proj.weight.shape == (24, 16) and mod.q_proj.bias is None
    assert mod.k_proj.weight.shape == (12, 3) and mod.k_proj.bias is not None
    assert mod.v_proj.weight.shape == (12, 5) and mod.out_proj.weight.shape == (7, 24)
    assert mod.out_proj.bias is None


def test_factory_kwargs_and_dropout_only_in_training():
    mod = mh.MultiHeadAttention(8, 2, dropout=0.5, dtype=torch.float64)
    assert all(p.dtype == torch.float64 for p in mod.parameters())
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    torch.manual_seed(0)
    assert not torch.allclose(mod(x), mod.eval()(x))
    assert torch.equal(mod(x), mod(x))


def test_causal_flag_in_module_never_sees_the_future():
    mod = mh.MultiHeadAttention(8, 2)
    x = torch.randn(1, 6, 8)
    changed = x.clone()
    changed[:, 4:] += 1.0
    assert torch.allclose(mod(x, causal=True)[:, :4], mod(changed, causal=True)[:, :4], atol=1e-6)


def test_causal_module_is_causal_on_every_call():
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(8, 2, causal=True)
    plain = mh.MultiHeadAttention(8, 2)
    plain.load_state_dict(mod.state_dict())
    x = torch.randn(2, 5, 8)
    assert torch.equal(mod(x), plain(x, causal=True)) and torch.equal(mod(x, causal=True), mod(x))
    assert "causal=True" in repr(mod)


# ---------------------------------------------------------------- nn.MultiheadAttention parity

def _torch_pair(batch_first=True, bias=True, kdim=None, vdim=None, E=12, H=3):
    torch.manual_seed(1)
    theirs = nn.MultiheadAttention(E, H, bias=bias, kdim=kdim, vdim=vdim, batch_first=batch_first).eval()
    with torch.no_grad():
        for p in theirs.parameters():  # non-zero biases so that a dropped bias would show
            p.add_(torch.randn_like(p) * 0.1)
    return theirs, mh.MultiHeadAttention.from_module(theirs)


def _inputs(B, Lq, Lk, E, kdim, vdim, batch_first):
    shape = (lambda L, F: (B, L, F)) if batch_first else (lambda L, F: (L, B, F))
    return torch.randn(shape(Lq, E)), torch.randn(shape(Lk, kdim or E)), torch.randn(shape(Lk, vdim or E))


PARITY = [
    dict(), dict(batch_first=False), dict(bias=False), dict(kdim=5, vdim=7), dict(kdim=5, vdim=7, batch_first=False),
]


@pytest.mark.filterwarnings("ignore:Support for mismatched key_padding_mask")  # a float mask + bool padding, on purpose
@pytest.mark.parametrize("opts", PARITY, ids=str)
def test_parity_with_torch_for_every_torch_mask(opts):
    theirs, ours = _torch_pair(**opts)
    batch_first = opts.get("batch_first", True)
    B, Lq, Lk, E = 2, 5, 6, 12
    pad = torch.zeros(B, Lk, dtype=torch.bool)
    pad[1, 4:] = True
    bool_mask = torch.rand(Lq, Lk) > 0.6
    bool_mask[:, 0] = False  # every query keeps key 0, so torch gives no NaN rows
    float_mask = torch.randn(Lq, Lk)
    cases = [
        ({}, {}),
        ({"key_padding_mask": pad}, {"mask": mh.Mask.key_padding(pad)}),
        ({"attn_mask": bool_mask}, {"mask": mh.Mask.block(bool_mask)}),
        ({"attn_mask": float_mask}, {"mask": mh.Mask.additive(float_mask)}),
        ({"attn_mask": float_mask, "key_padding_mask": pad},
         {"mask": mh.Mask.additive(float_mask) & mh.Mask.key_padding(pad)}),
    ]
    for torch_kwargs, our_kwargs in cases:
        q, k, v = (t.requires_grad_() for t in _inputs(B, Lq, Lk, E, opts.get("kdim"), opts.get("vdim"), batch_first))
        expected = theirs(q, k, v, need_weights=False, **torch_kwargs)[0]
        got = ours(q, k, v, **our_kwargs)
        assert max_abs_diff(got, expected) < 1e-5, torch_kwargs.keys()
        g_theirs = torch.autograd.grad(expected.sum(), (q, k, v))
        g_ours = torch.autograd.grad(got.sum(), (q, k, v))
        assert all(max_abs_diff(a, b) < 1e-5 for a, b in zip(g_ours, g_theirs))


def test_parity_with_torch_causal():
    theirs, ours = _torch_pair()
    x = torch.randn(2, 7, 12)
    causal = nn.Transformer.generate_square_subsequent_mask(7)
    expected = theirs(x, x, x, attn_mask=causal, is_causal=True, need_weights=False)[0]
    assert max_abs_diff(ours(x, causal=True), expected) < 1e-5


def test_from_module_copies_weights_and_keeps_settings():
    theirs, ours = _torch_pair(batch_first=False)
    assert ours.batch_first is False and ours.num_heads == 3
    with torch.no_grad():
        theirs.out_proj.weight.zero_()
    assert ours.out_proj.weight.abs().sum() > 0  # independent copy
    again = mh.MultiHeadAttention.from_module(ours)
    assert again is not ours and torch.equal(again.q_proj.weight, ours.q_proj.weight)


def test_empty_sequences_through_the_module():
    mod = mh.MultiHeadAttention(8, 2)
    assert mod(torch.randn(2, 0, 8)).shape == (2, 0, 8)
    no_keys = mod(torch.randn(2, 3, 8), torch.randn(2, 0, 8))  # every query fully masked
    expected = mod.out_proj.bias.expand(2, 3, 8)  # zero attention output, then the output projection
    assert torch.allclose(no_keys, expected)
