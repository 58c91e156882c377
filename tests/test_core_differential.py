"""mh.DifferentialAttention: two softmax maps per head pair, subtracted, normed; caches, precisions, compile."""
from __future__ import annotations

import math

import pytest
import torch

import multihead as mh
from helpers import assert_compiles_across_lengths, decoded_step_by_step
from multihead.layers.differential import lambda_init_for_layer

E, H, HKV, L, D = 32, 4, 2, 9, 8


def differential(dtype=torch.float64, **options) -> mh.DifferentialAttention:
    torch.manual_seed(0)
    return mh.DifferentialAttention(E, H, num_kv_heads=HKV, causal=True, lambda_init=lambda_init_for_layer(2),
                                    dtype=dtype, **options).eval()


def by_hand(mod: mh.DifferentialAttention, x: torch.Tensor) -> torch.Tensor:
    """The paper's formula with explicit softmax maps, in x's dtype (float64 for the reference)."""
    B = x.shape[0]
    q = mod.q_proj(x).view(B, L, H, D).transpose(1, 2)
    k = mod.k_proj(x).view(B, L, HKV, D).transpose(1, 2).repeat_interleave(H // HKV, dim=1)
    v = mod.v_proj(x).view(B, L, HKV, D).transpose(1, 2)
    causal = torch.ones(L, L, dtype=torch.bool).tril()
    maps = torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(D)).masked_fill(~causal, float("-inf")), -1)
    exp_dot = lambda a, b: torch.exp((a * b).sum(dtype=torch.float32)).to(x.dtype)  # noqa: E731 (float32, as HF)
    lam = exp_dot(mod.lambda_q1, mod.lambda_k1) - exp_dot(mod.lambda_q2, mod.lambda_k2) + mod.lambda_init
    outs = []
    for i in range(H // 2):
        kv = i // (H // HKV)  # head i's kv head; its value halves are heads kv mod HKV/2 and + HKV/2
        wide = torch.cat([v[:, kv % (HKV // 2)], v[:, kv % (HKV // 2) + HKV // 2]], dim=-1)  # (B, L, 2D)
        pair = maps[:, i] @ wide - lam * (maps[:, i + H // 2] @ wide)
        outs.append((1 - mod.lambda_init) * torch.nn.functional.rms_norm(pair, (2 * D,), eps=mod.pair_norm.eps))
    return mod.out_proj(torch.cat(outs, dim=-1))


def test_equals_the_formula_with_two_softmax_maps():
    mod = differential()
    x = torch.randn(2, L, E, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(mod(x), by_hand(mod, x))
    assert "differential=True" in repr(mod)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_low_precision_stays_within_twice_the_hand_written_drift(dtype):
    reference = differential()
    mod = differential(dtype)
    mod.load_state_dict({name: t.to(dtype) for name, t in reference.state_dict().items()})
    x = torch.randn(2, L, E, dtype=torch.float64)
    with torch.no_grad():
        expected = by_hand(reference, x)
        drift = (by_hand(mod, x.to(dtype)).double() - expected).abs().max()
        assert (mod(x.to(dtype)).double() - expected).abs().max() <= 2 * drift + 1e-6


@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_cached_steps_equal_the_full_forward(mode):
    mod = differential()
    x = torch.randn(2, L, E, dtype=torch.float64)
    with getattr(torch, mode)():
        full = mod(x)
        steps = decoded_step_by_step(mod, x, prefill=5)
    torch.testing.assert_close(steps, full)


def test_gradients_reach_every_lambda():
    mod = differential().train()
    mod(torch.randn(2, L, E, dtype=torch.float64)).sum().backward()
    for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
        assert getattr(mod, name).grad.abs().sum() > 0, name


def test_compiles_with_dynamic_lengths():
    assert_compiles_across_lengths(differential(torch.float32), E)


@pytest.mark.parametrize("options, match", [
    (dict(num_heads=3, num_kv_heads=3), "must be even"),
    (dict(num_heads=4, num_kv_heads=1), "must be even"),
    (dict(num_heads=4, dropout=0.1), "no dropout"),
    (dict(num_heads=4, lambda_init=float("nan")), "finite number"),
])
def test_bad_settings_are_refused(options, match):
    options = {"lambda_init": 0.5, **options}
    heads = options.pop("num_heads")
    with pytest.raises(mh.AttentionError, match=match):
        mh.DifferentialAttention(24, heads, **options)


def test_the_depth_schedule_and_nn_multihead_attention():
    assert lambda_init_for_layer(0) == pytest.approx(0.2) and lambda_init_for_layer(100) == pytest.approx(0.8)
    with pytest.raises(mh.AttentionError, match="differential head pairs"):
        mh.DifferentialAttention(E, H, lambda_init=0.5).to_torch()
