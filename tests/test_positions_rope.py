"""RoPE against a float64 reference written with complex numbers, and the properties RoPE exists for:
turning keeps lengths, q·k depends only on the relative position, rows of a batch are independent.

The reference treats each feature pair (a, b) as the complex number a + ib and multiplies it by
e^(i · position · inv_freq): nothing of the module's own rotate code is reused.
"""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from multihead.positions import apply_rotary

SETTINGS = settings(max_examples=30, deadline=None)
KINDS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 3.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def reference_rope(x, positions, inv_freq, rotary_dim, interleaved):
    """x (B, H, L, D) turned in float64; positions (L,) or (B, L); inv_freq (R/2,)."""
    x = x.to(torch.float64)
    R = rotary_dim
    turning, passing = x[..., :R], x[..., R:]
    if interleaved:
        pairs = turning.unflatten(-1, (R // 2, 2))  # (B, H, L, R/2, 2): features 2k, 2k+1
        z = torch.complex(pairs[..., 0], pairs[..., 1])
    else:
        z = torch.complex(turning[..., : R // 2], turning[..., R // 2:])  # features k, k + R/2
    angles = positions.to(torch.float64)[..., None] * inv_freq.to(torch.float64)  # (..., L, R/2)
    if angles.dim() == 3:
        angles = angles[:, None]  # (B, L, R/2) -> (B, 1, L, R/2): broadcast over heads
    z = z * torch.polar(torch.ones_like(angles), angles)
    if interleaved:
        turned = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    else:
        turned = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((turned, passing), dim=-1)


@st.composite
def setups(draw, kinds=tuple(KINDS)):
    D = 2 * draw(st.integers(2, 12))
    R = 2 * draw(st.integers(1, D // 2))
    B, H, L = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 6))
    rope = mh.RoPE(D, base=draw(st.sampled_from([10.0, 10000.0, 500000.0])), rotary_dim=R,
                   interleaved=draw(st.booleans()), scaling=KINDS[draw(st.sampled_from(kinds))])
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    x = torch.randn(B, H, L, D, generator=g)
    starts = torch.randint(0, 300, (B, 1), generator=g)
    return rope, x, starts + torch.arange(L), g  # positions (B, L): each row starts elsewhere


@SETTINGS
@given(setups())
def test_rope_equals_the_complex_reference(setup):
    rope, x, positions, _ = setup
    out, _ = rope(x, x, positions)
    expected = reference_rope(x, positions, rope.inv_freq, rope.rotary_dim, rope.interleaved)
    torch.testing.assert_close(out.double(), expected, atol=2e-4, rtol=1e-5)  # fp32 angles up to ~300 rad


@SETTINGS
@given(setups())
def test_turning_keeps_every_vector_length(setup):
    rope, x, positions, _ = setup
    out, _ = rope(x, x, positions)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-5, rtol=1e-5)


@SETTINGS
@given(setups(), st.integers(1, 200))
def test_scores_depend_only_on_relative_position(setup, shift):
    rope, x, positions, g = setup
    q = x / x.norm(dim=-1, keepdim=True)  # unit vectors: scores in [-1, 1]
    k = torch.randn(x.shape, generator=g)
    k = k / k.norm(dim=-1, keepdim=True)
    q1, k1 = rope(q, k, positions)
    q2, k2 = rope(q, k, positions + shift)  # every query and key moved by the same amount
    torch.testing.assert_close(q2 @ k2.transpose(-1, -2), q1 @ k1.transpose(-1, -2), atol=5e-4, rtol=0)


@SETTINGS
@given(setups())
def test_per_row_positions_equal_each_row_alone(setup):
    rope, x, positions, _ = setup
    together, _ = rope(x, x, positions)
    for b in range(x.shape[0]):
        alone, _ = rope(x[b:b + 1], x[b:b + 1], positions[b])  # (L,) positions for a batch of one
        torch.testing.assert_close(together[b:b + 1], alone, atol=1e-6, rtol=1e-6)


def test_shared_positions_equal_them_repeated_per_row():
    rope = mh.RoPE(8, interleaved=True)
    q, k = torch.randn(3, 2, 5, 8), torch.randn(3, 1, 5, 8)
    shared = rope(q, k, torch.arange(4, 9))
    for by_row, by_length in zip(rope(q, k, torch.arange(4, 9).expand(3, 5)), shared):
        torch.testing.assert_close(by_row, by_length, atol=0, rtol=0)


def test_interleaved_and_half_split_are_one_rotation_with_features_permuted():
    D = 8
    to_half_split = torch.cat((torch.arange(0, D, 2), torch.arange(1, D, 2)))  # 0 2 4 6 1 3 5 7
    x, positions = torch.randn(2, 3, 4, D), torch.tensor([[0, 1, 2, 3], [7, 8, 9, 10]])
    interleaved, _ = mh.RoPE(D, interleaved=True)(x, x, positions)
    half_split, _ = mh.RoPE(D)(x[..., to_half_split], x[..., to_half_split], positions)
    torch.testing.assert_close(half_split, interleaved[..., to_half_split], atol=1e-6, rtol=1e-6)


def test_partial_rotary_leaves_the_other_features_untouched():
    x = torch.randn(1, 2, 5, 16)
    out, _ = mh.RoPE(16, rotary_dim=4)(x, x, torch.arange(5))
    assert torch.equal(out[..., 4:], x[..., 4:])
    assert not torch.allclose(out[..., :4], x[..., :4])


def test_dynamic_ntk_equals_plain_rope_with_the_grown_base_for_the_batch():
    D, N, factor = 16, 32, 2.0
    rope = mh.RoPE(D, scaling={"rope_type": "dynamic", "factor": factor}, max_position=N)
    positions = torch.tensor([[40, 41, 42], [10, 11, 12]])  # the batch reaches 43 > N: both rows grow
    grown_base = 10000.0 * (factor * 43 / N - (factor - 1)) ** (D / (D - 2))  # the NTK-aware formula
    x = torch.randn(2, 2, 3, D)
    expected, _ = mh.RoPE(D, base=grown_base)(x, x, positions)
    torch.testing.assert_close(rope(x, x, positions)[0], expected, atol=1e-5, rtol=1e-5)
    inside, _ = rope(x, x, positions - 20)  # now inside N: plain RoPE with the original base
    torch.testing.assert_close(inside, mh.RoPE(D)(x, x, positions - 20)[0], atol=0, rtol=0)


def test_llama3_keeps_fast_pairs_and_slows_slow_ones():
    llama31 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}
    plain, scaled = mh.RoPE(128, base=500000.0), mh.RoPE(128, base=500000.0, scaling=llama31)
    ratio = plain.inv_freq / scaled.inv_freq  # how many times slower each pair turns
    wavelength = 2 * math.pi / plain.inv_freq
    assert torch.equal(ratio[wavelength < 8192 / 4], torch.ones_like(ratio[wavelength < 8192 / 4]))
    torch.testing.assert_close(ratio[wavelength > 8192], torch.full_like(ratio[wavelength > 8192], 8.0))
    assert bool((ratio[1:] >= ratio[:-1]).all()) and 1 < ratio[(wavelength > 2048) & (wavelength < 8192)].min()


# --- cos_sin and apply_rotary ----------------------------------------------------------------------

@pytest.mark.parametrize("interleaved", [False, True])
def test_cos_sin_with_apply_rotary_equals_the_module(interleaved):
    rope = mh.RoPE(12, rotary_dim=8, interleaved=interleaved, dtype=torch.float64)
    q, positions = torch.randn(2, 3, 4, 12, dtype=torch.float64), torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    cos, sin = rope.cos_sin(positions)
    assert cos.shape == sin.shape == (2, 4, 8) and cos.dtype == torch.float64  # the module's dtype
    torch.testing.assert_close(apply_rotary(q, cos, sin, interleaved), rope(q, q, positions)[0], atol=0, rtol=0)
    assert rope.cos_sin(torch.arange(4), torch.bfloat16)[0].shape == (1, 4, 8)


def test_apply_rotary_gradients_are_the_inverse_rotation():
    cos, sin = mh.RoPE(6).cos_sin(torch.tensor([[1, 5, 9]]), torch.float64)
    x = torch.randn(1, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: apply_rotary(t, cos, sin, False), (x,))


# --- dtypes and buffers ----------------------------------------------------------------------------

def test_module_has_no_parameters_and_saves_nothing():
    rope = mh.RoPE(8, scaling={"rope_type": "dynamic", "factor": 2.0}, max_position=16)
    assert list(rope.parameters()) == [] and rope.state_dict() == {}
    assert {name for name, _ in rope.named_buffers()} == {"inv_freq", "seen_length"}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_casting_the_module_keeps_fp32_frequencies_and_outputs_follow_the_input(dtype):
    reference = mh.RoPE(8, scaling=KINDS["llama3"])
    rope = mh.RoPE(8, scaling=KINDS["llama3"]).to(dtype)
    assert rope.inv_freq.dtype == torch.float32 and torch.equal(rope.inv_freq, reference.inv_freq)
    q = torch.randn(1, 2, 3, 8).to(dtype)
    out, _ = rope(q, q, torch.arange(3))
    assert out.dtype == dtype
    torch.testing.assert_close(out, reference(q, q, torch.arange(3))[0], atol=0, rtol=0)


def test_repr_names_the_settings():
    text = repr(mh.RoPE(16, interleaved=True, rotary_dim=8, scaling={"type": "linear", "factor": 2}))
    assert "rotary_dim=8" in text and "interleaved=True" in text and "'linear'" in text
