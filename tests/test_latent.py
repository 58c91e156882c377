"""MultiHeadLatentAttention: naive and absorbed agree, match a float64 reference, and take masks and grads."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from helpers import reference_mla
from multihead.layers.latent import MultiHeadLatentAttention


def make_mla(seed=0, *, H=4, C=16, Dn=8, R=4, Dv=6, E=32, q_lora_rank=None, bias=False, interleaved=True,
             dtype=torch.float32):
    """A small causal MLA whose norms have non-trivial weights (so a mix-up shows)."""
    torch.manual_seed(seed)
    mla = MultiHeadLatentAttention(E, H, kv_lora_rank=C, qk_nope_head_dim=Dn, qk_rope_head_dim=R, v_head_dim=Dv,
                                   q_lora_rank=q_lora_rank, bias=bias, causal=True,
                                   rope=mh.RoPE(R, interleaved=interleaved))
    with torch.no_grad():
        for norm in (mla.kv_a_layernorm, mla.q_a_layernorm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    return mla.to(dtype)


@settings(max_examples=15, deadline=None)
@given(H=st.integers(1, 4), C=st.sampled_from([4, 8, 16]), Dn=st.sampled_from([2, 4, 8]), R=st.sampled_from([2, 4]),
       Dv=st.sampled_from([2, 6]), L=st.integers(1, 9), B=st.integers(1, 3), q_lora=st.booleans(),
       bias=st.booleans(), interleaved=st.booleans(), seed=st.integers(0, 1000))
def test_absorbed_equals_naive_fp32(H, C, Dn, R, Dv, L, B, q_lora, bias, interleaved, seed):
    mla = make_mla(seed, H=H, C=C, Dn=Dn, R=R, Dv=Dv, q_lora_rank=6 if q_lora else None, bias=bias,
                   interleaved=interleaved)
    x = torch.randn(B, L, 32)
    naive, absorbed = mla(x, absorb=False), mla(x, absorb=True)
    torch.testing.assert_close(absorbed, naive, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(naive.double(), reference_mla(mla, x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("absorb", [False, True])
def test_low_precision_within_twice_the_reference_drift(dtype, absorb):
    mla = make_mla(1, H=8, C=64, Dn=16, R=8, Dv=16, E=64, q_lora_rank=24)
    x = torch.randn(2, 33, 64)
    exact = reference_mla(mla, x)
    low = mla.to(dtype)
    drift = (reference_mla(low, x.to(dtype), compute_dtype=dtype).double() - exact).abs().max().item()
    error = (low(x.to(dtype), absorb=absorb).double() - exact).abs().max().item()
    assert error <= 2 * drift + 1e-3, (error, drift)


def test_masks_like_multihead_attention():
    mla = make_mla(2)
    x = torch.randn(2, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # True = padding
    keep = (~pad)[:, None, None, :]
    for absorb in (False, True):
        out = mla(x, mask=mh.Mask.key_padding(pad), absorb=absorb)
        torch.testing.assert_close(out.double(), reference_mla(mla, x, keep=keep), rtol=1e-5, atol=1e-5)
    plain = make_mla(2)
    plain.causal = False
    torch.testing.assert_close(plain(x, causal=True), mla(x))  # forward's causal=True adds the mask


def test_grad_of_the_naive_path_matches_float64():
    mla = make_mla(3, q_lora_rank=8).double()
    x = torch.randn(2, 5, 32, dtype=torch.float64, requires_grad=True)
    mla(x, absorb=False).square().sum().backward()
    ours = [x.grad] + [p.grad.clone() for p in mla.parameters()]
    x.grad = None
    mla.zero_grad()
    reference_mla(mla, x).square().sum().backward()
    expected = [x.grad] + [p.grad for p in mla.parameters()]
    for got, want in zip(ours, expected):
        torch.testing.assert_close(got, want)


def test_inference_mode_and_no_grad():
    mla = make_mla(4)
    x = torch.randn(1, 4, 32)
    expected = mla(x).detach()
    with torch.inference_mode():
        cache = mla.new_cache(1, 8)
        torch.testing.assert_close(mla(x, cache=cache), expected)
    with torch.no_grad():
        torch.testing.assert_close(mla(x, absorb=True), expected, rtol=1e-5, atol=1e-6)


def test_bad_construction_and_calls_raise_attention_error():
    with pytest.raises(mh.AttentionError, match="kv_lora_rank must be a positive int"):
        MultiHeadLatentAttention(32, 4, kv_lora_rank=0, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6)
    with pytest.raises(mh.AttentionError, match="rope must be an mh.RoPE over qk_rope_head_dim=4"):
        MultiHeadLatentAttention(32, 4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
                                 rope=mh.RoPE(8))
    mla = make_mla(5)
    with pytest.raises(mh.AttentionError, match=r"x must be \(B, L, E=32\); got \(2, 3, 31\)"):
        mla(torch.randn(2, 3, 31))
    with pytest.raises(mh.AttentionError, match="module's parameters are torch.float32"):
        mla(torch.randn(2, 3, 32, dtype=torch.float64))
    with pytest.raises(mh.AttentionError, match="absorb must be True or False"):
        mla(torch.randn(1, 3, 32), absorb=1)


def test_up_weights_are_the_halves_of_kv_b_proj():
    mla = make_mla(6)
    w_uk, w_uv = mla.up_weights()
    assert w_uk.shape == (4, 8, 16) and w_uv.shape == (4, 6, 16)
    rows = mla.kv_b_proj.weight.view(4, 14, 16)
    assert torch.equal(w_uk, rows[:, :8]) and torch.equal(w_uv, rows[:, 8:])
    assert w_uk.data_ptr() == mla.kv_b_proj.weight.data_ptr()  # views: nothing copied


def test_the_absorbed_step_follows_every_change_of_kv_b_proj():
    """The contiguous W_UK / W_UV the absorbed step keeps are made again after an in-place update, a new weight
    and a dtype change; with autograd on, kv_b_proj still gets its gradient through the absorbed path."""
    torch.manual_seed(0)
    mla = MultiHeadLatentAttention(32, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8)
    x = torch.randn(2, 5, 32)
    with torch.no_grad():
        first = mla(x, absorb=True)
        halves = mla._absorb_weights()
        assert all(t.is_contiguous() for t in halves) and mla._absorb_weights()[0] is halves[0]  # kept
        mla.kv_b_proj.weight.mul_(2.0)  # an optimizer step: in place
        torch.testing.assert_close(mla(x, absorb=True), mla(x, absorb=False), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(mla(x, absorb=True), first)
        mla.kv_b_proj.weight = torch.nn.Parameter(torch.randn_like(mla.kv_b_proj.weight))  # a new weight
        torch.testing.assert_close(mla(x, absorb=True), mla(x, absorb=False), rtol=1e-5, atol=1e-5)
        low = mla.to(torch.bfloat16)
        assert low._absorb_weights()[0].dtype == torch.bfloat16
    mla.float()(x, absorb=True).square().sum().backward()
    assert mla.kv_b_proj.weight.grad is not None and mla.kv_b_proj.weight.grad.abs().sum() > 0
