"""YaRN and LongRoPE against transformers' own rotary embeddings (Llama with yarn, Phi-3 with longrope),
and the HF config conversion that now accepts them. Tiny local configs: nothing downloads."""
from __future__ import annotations

import copy
import math

import pytest
import torch

import multihead as mh

transformers = pytest.importorskip("transformers")
from transformers.models.llama import modeling_llama as llama  # noqa: E402
from transformers.models.phi3 import modeling_phi3 as phi3  # noqa: E402

pytestmark = pytest.mark.models

H, D, N = 4, 16, 32  # heads, head dim, original context length
FP32 = dict(atol=2e-6, rtol=2e-6)
YARN = {
    "plain": dict(factor=4.0),
    "DeepSeek's mscale": dict(factor=40.0, mscale=0.707, mscale_all_dim=0.707, beta_fast=32, beta_slow=1),
    "unequal mscale": dict(factor=8.0, mscale=1.0, mscale_all_dim=0.5),
    "given attention factor, no truncation": dict(factor=2.0, attention_factor=1.3, truncate=False),
}


def ours_for(config, head_dim: int = D) -> mh.RoPE:
    params = copy.deepcopy(config.rope_parameters)
    return mh.RoPE(head_dim, base=params["rope_theta"], scaling=params, max_position=config.max_position_embeddings)


def positions_across(limit: int) -> torch.Tensor:
    return torch.tensor([[0, 1, 5, limit - 1], [3, 17, limit + 40, 2 * limit]])


@pytest.mark.parametrize("name", sorted(YARN))
def test_yarn_cos_sin_equal_llamas_rotary_embedding(name):
    config = transformers.LlamaConfig(hidden_size=H * D, num_attention_heads=H, head_dim=D, max_position_embeddings=4 * N,
                                      rope_parameters=dict(rope_type="yarn", rope_theta=10000.0,
                                                           original_max_position_embeddings=N, **YARN[name]))
    positions = positions_across(N)
    theirs = llama.LlamaRotaryEmbedding(config)(torch.zeros(1), positions)
    ours = ours_for(config).cos_sin(positions, torch.float32)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **FP32)


def test_yarn_without_a_factor_stretches_to_max_position():
    rope = mh.RoPE(D, scaling=dict(rope_type="yarn", factor=None, original_max_position_embeddings=N), max_position=4 * N)
    assert rope.scaling.factor == 4.0
    assert math.isclose(rope.scaling.attention_factor, 0.1 * math.log(4.0) + 1)


def phi3_config(partial: float = 1.0):
    rotary = int(D * partial) // 2
    return transformers.Phi3Config(
        hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H, max_position_embeddings=4 * N,
        original_max_position_embeddings=N, vocab_size=50, num_hidden_layers=1, intermediate_size=32,
        partial_rotary_factor=partial, pad_token_id=0,
        rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                             long_factor=[1.0 + 0.5 * i for i in range(rotary)],
                             short_factor=[1.0 + 0.1 * i for i in range(rotary)]))


@pytest.mark.parametrize("reach", [N - 5, N, N + 9], ids=["within N", "exactly N", "past N"])
def test_longrope_picks_short_or_long_factors_per_call_like_phi3(reach):
    config = phi3_config()
    positions = torch.arange(reach)[None]
    theirs = phi3.Phi3RotaryEmbedding(config)(torch.zeros(1), positions)
    ours = ours_for(config).cos_sin(positions, torch.float32)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **FP32)


def test_longrope_switches_under_compile_without_a_graph_break():
    rope = ours_for(phi3_config())
    compiled = torch.compile(lambda p: rope.cos_sin(p), fullgraph=True, dynamic=True)
    for reach in (N - 3, N + 3):
        positions = torch.arange(reach)[None]
        torch.testing.assert_close(compiled(positions)[0], rope.cos_sin(positions)[0])


@pytest.mark.parametrize("bad, match", [
    (dict(long_factor=[1.0] * 3, short_factor=[1.0] * 3), "one factor per rotated pair"),
    (dict(long_factor="1,2", short_factor=[1.0] * 8), "list of positive numbers"),
    (dict(long_factor=[1.0] * 8, short_factor=[0.0] * 8), "positive finite"),
])
def test_bad_longrope_dicts_are_refused(bad, match):
    with pytest.raises(mh.AttentionError, match=match):
        mh.RoPE(D, scaling=dict(rope_type="longrope", original_max_position_embeddings=N, **bad), max_position=4 * N)


def test_yarn_needs_a_length_and_a_sane_truncate():
    with pytest.raises(mh.AttentionError, match="original context length"):
        mh.RoPE(D, scaling=dict(rope_type="yarn", factor=2.0))
    with pytest.raises(mh.AttentionError, match="truncate"):
        mh.RoPE(D, scaling=dict(rope_type="yarn", factor=2.0, truncate="yes", original_max_position_embeddings=N))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_attention_factor_scales_scores_by_its_square(dtype):
    """Turning keeps lengths, so q·k after YaRN is attention_factor² times q·k after plain RoPE at N."""
    yarn = mh.RoPE(D, scaling=dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=N))
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 3, D, generator=g).to(dtype), torch.randn(1, 1, 3, D, generator=g).to(dtype)
    position = torch.zeros(3, dtype=torch.long)  # angle 0: only the factor acts
    q_turned, k_turned = yarn(q, k, position)
    factor = yarn.scaling.attention_factor
    expected = (q.double() @ k.double().transpose(-1, -2)) * factor ** 2
    got = (q_turned.double() @ k_turned.double().transpose(-1, -2))
    tolerance = {torch.float32: 1e-5, torch.bfloat16: 0.1, torch.float16: 0.02}[dtype]
    torch.testing.assert_close(got, expected, atol=tolerance, rtol=tolerance)


def test_a_yarn_llama_layer_converts_and_matches_hf():
    """hf_config no longer refuses yarn: the converted layer equals HF's inside the model."""
    config = transformers.LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=2, head_dim=D,
                                      intermediate_size=32, num_hidden_layers=1, vocab_size=50, max_position_embeddings=4 * N,
                                      rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                           original_max_position_embeddings=N))
    model = transformers.LlamaModel(config).eval()
    layer = model.layers[0].self_attn
    ours = mh.MultiHeadAttention.from_module(layer).eval()
    x = torch.randn(2, 2 * N, H * D, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(2 * N)[None]
    cos_sin = model.rotary_emb(x, positions)
    mask = torch.full((2 * N, 2 * N), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        theirs, _ = layer(x, position_embeddings=cos_sin, attention_mask=mask)
        torch.testing.assert_close(ours(x), theirs, atol=1e-5, rtol=1e-5)
