"""mh.GatedMultiHeadAttention: out_proj(attn * sigmoid(gate_proj(x))), with caches, precisions and compile."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from helpers import assert_compiles_across_lengths, decoded_step_by_step

E, H, HKV, L = 32, 4, 2, 9


def gated(dtype=torch.float64, **options) -> mh.GatedMultiHeadAttention:
    torch.manual_seed(0)
    return mh.GatedMultiHeadAttention(E, H, num_kv_heads=HKV, causal=True, dtype=dtype, **options).eval()


def by_hand(mod: mh.GatedMultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """The same module's attention with gate_heads left out, then the gate applied by hand."""
    plain = mh.MultiHeadAttention(E, H, num_kv_heads=HKV, causal=True, dtype=x.dtype).eval()
    for name in ("q_proj", "k_proj", "v_proj"):
        getattr(plain, name).load_state_dict(getattr(mod, name).state_dict())
    torch.nn.init.eye_(plain.out_proj.weight)
    torch.nn.init.zeros_(plain.out_proj.bias)
    merged = plain(x)  # (B, L, H*D): the heads, merged, before any output projection
    return mod.out_proj(merged * torch.sigmoid(mod.gate_proj(x)))


def test_the_gate_scales_each_head_feature_before_out_proj():
    mod = gated()
    x = torch.randn(2, L, E, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mod(x), by_hand(mod, x))
    assert "gated=True" in repr(mod) and mod.gate_proj.weight.shape == (H * (E // H), E)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_stays_within_twice_the_plain_drift(dtype):
    reference = gated()
    mod = gated(dtype)
    mod.load_state_dict({name: t.to(dtype) for name, t in reference.state_dict().items()})
    x = torch.randn(2, L, E, dtype=torch.float64)
    with torch.no_grad():
        expected = reference(x)
        got = mod(x.to(dtype)).double()
        plain = by_hand(mod, x.to(dtype)).double()  # the same arithmetic, written out, in `dtype`
    assert (got - expected).abs().max() <= 2 * (plain - expected).abs().max() + 1e-6


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_cached_steps_equal_the_full_forward(mode):
    mod = gated()
    x = torch.randn(2, L, E, dtype=torch.float64)
    with getattr(torch, mode)():
        full = mod(x)
        steps = decoded_step_by_step(mod, x, prefill=4)
    torch.testing.assert_close(steps, full)


def test_gradients_reach_the_gate():
    mod = gated().train()
    mod(torch.randn(2, L, E, dtype=torch.float64)).sum().backward()
    assert mod.gate_proj.weight.grad is not None and mod.gate_proj.weight.grad.abs().sum() > 0


def test_compiles_with_dynamic_lengths():
    assert_compiles_across_lengths(gated(torch.float32), E)


def test_nn_multihead_attention_cannot_hold_a_gate():
    mod = mh.GatedMultiHeadAttention(E, H)
    with pytest.raises(mh.AttentionError, match="an output gate"):
        mod.to_torch()
