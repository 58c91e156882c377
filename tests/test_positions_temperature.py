"""QueryTemperature (Llama 4's NoPE layers) and the module's chunk_size / temperature options."""
from __future__ import annotations

import math

import pytest
import torch

import multihead as mh
from helpers import assert_compiles_across_lengths, decoded_step_by_step
from multihead.positions import QueryTemperature


def test_the_factor_follows_the_formula():
    temperature = QueryTemperature(floor_scale=4, attn_scale=0.5)
    positions = torch.arange(20)
    expected = torch.tensor([0.5 * math.log(1 + math.floor((p + 1) / 4)) + 1 for p in range(20)])
    torch.testing.assert_close(temperature.factor(positions), expected)
    q = torch.randn(2, 3, 20, 8, dtype=torch.bfloat16)
    torch.testing.assert_close(temperature(q, positions), (q.float() * expected.view(1, 1, -1, 1)).bfloat16())


def test_per_row_positions_scale_each_row_apart():
    temperature = QueryTemperature(2, 1.0)
    q = torch.ones(2, 1, 3, 4)
    out = temperature(q, torch.tensor([[0, 1, 2], [10, 11, 12]]))
    assert out[0, 0, :, 0].tolist() == pytest.approx(temperature.factor(torch.tensor([0, 1, 2])).tolist())
    assert out[1, 0, 0, 0] > out[0, 0, 2, 0]


@pytest.mark.parametrize("args, match", [((0, 0.1), "floor_scale"), ((4, float("inf")), "attn_scale"),
                                         ((True, 0.1), "floor_scale")])
def test_bad_settings_are_refused(args, match):
    with pytest.raises(mh.AttentionError, match=match):
        QueryTemperature(*args)


def test_bad_positions_are_refused():
    with pytest.raises(mh.AttentionError, match="positions"):
        QueryTemperature(4, 0.1)(torch.randn(1, 1, 3, 4), torch.arange(5))


@pytest.mark.parametrize("options", [dict(temperature=QueryTemperature(3, 0.7)), dict(chunk_size=4),
                                     dict(chunk_size=3, rope=mh.RoPE(8, interleaved=True), qk_norm=True)],
                         ids=["temperature", "chunks", "chunks+rope+qk_norm"])
def test_cached_steps_equal_the_full_forward(options):
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(16, 2, causal=True, dtype=torch.float64, **options).eval()
    x = torch.randn(2, 11, 16, dtype=torch.float64)
    with torch.inference_mode():
        full = mod(x)
        steps = decoded_step_by_step(mod, x, prefill=6)
    torch.testing.assert_close(steps, full)
    assert any(name in repr(mod) for name in ("temperature=True", "chunk_size="))


def test_module_options_are_checked():
    with pytest.raises(mh.AttentionError, match="chunk_size must be a positive int"):
        mh.MultiHeadAttention(16, 2, chunk_size=0)
    with pytest.raises(mh.AttentionError, match="QueryTemperature"):
        mh.MultiHeadAttention(16, 2, temperature=lambda q, p: q)
    with pytest.raises(mh.AttentionError, match="chunks, query temperature"):
        mh.MultiHeadAttention(16, 2, chunk_size=4, temperature=QueryTemperature(4, 0.1)).to_torch()


def test_compiles_with_dynamic_lengths():
    mod = mh.MultiHeadAttention(16, 2, causal=True, chunk_size=4, temperature=QueryTemperature(3, 0.7)).eval()
    assert_compiles_across_lengths(mod, 16, lengths=(6, 13))
