"""RoPE against transformers' own rotary code on the same inputs: Llama, GPT-NeoX, GPT-J, and HF's
rope scaling kinds (linear, dynamic NTK, llama3). Configs are tiny and built locally: nothing downloads.

fp32 must agree within 1e-6 (the arithmetic is the same, so in practice it agrees exactly).
"""
from __future__ import annotations

import copy

import pytest
import torch

import multihead as mh

transformers = pytest.importorskip("transformers")
from transformers.models.gpt_neox import modeling_gpt_neox as neox  # noqa: E402
from transformers.models.gptj import modeling_gptj as gptj  # noqa: E402
from transformers.models.llama import modeling_llama as llama  # noqa: E402

pytestmark = pytest.mark.models

B, H, HKV, D = 2, 4, 2, 16  # batch, query heads, key heads, head dim
FP32 = dict(atol=1e-6, rtol=1e-6)


def qk(L: int, dtype=torch.float32, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, L, D, generator=g).to(dtype), torch.randn(B, HKV, L, D, generator=g).to(dtype)


def row_positions(L: int, starts=(0, 9)) -> torch.Tensor:
    """(B, L): row b continues at starts[b], as after a cache holding starts[b] tokens."""
    return torch.tensor(starts)[:, None] + torch.arange(L)


def llama_config(**rope):
    return transformers.LlamaConfig(hidden_size=H * D, num_attention_heads=H, num_key_value_heads=HKV, head_dim=D,
                                    max_position_embeddings=32, rope_parameters=rope or None)


def rope_like(config) -> mh.RoPE:
    """Our RoPE for an HF config, fed the config's own rope dict, as a converter would."""
    params = copy.deepcopy(config.rope_parameters)
    return mh.RoPE(D, base=params["rope_theta"], scaling=params, max_position=config.max_position_embeddings)


def hf_llama(rotary, q, k, positions):
    position_ids = positions if positions.dim() == 2 else positions[None]  # HF wants (B or 1, L)
    cos, sin = rotary(q, position_ids)
    return llama.apply_rotary_pos_emb(q, k, cos, sin)


# --- Llama: the half-split layout, GQA, per-row positions ------------------------------------------

@pytest.mark.parametrize("positions", [torch.arange(7), row_positions(7)], ids=["shared", "per-row"])
def test_llama_default_rope_matches_hf(positions):
    config = llama_config(rope_type="default", rope_theta=10000.0)
    q, k = qk(7)
    ours = mh.RoPE(D)(q, k, positions)
    theirs = hf_llama(llama.LlamaRotaryEmbedding(config), q, k, positions)
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **FP32)


def test_cos_sin_equal_hf_rotary_embedding_output():
    config = llama_config(rope_type="default", rope_theta=500.0)
    positions = row_positions(5, starts=(3, 40))
    cos, sin = mh.RoPE(D, base=500.0).cos_sin(positions, torch.float32)
    their_cos, their_sin = llama.LlamaRotaryEmbedding(config)(torch.zeros(1), positions)
    torch.testing.assert_close(cos, their_cos, **FP32)
    torch.testing.assert_close(sin, their_sin, **FP32)


def test_llama_bf16_matches_hf_exactly():
    config = llama_config(rope_type="default", rope_theta=10000.0)
    q, k = qk(6, torch.bfloat16)
    positions = row_positions(6)
    ours = mh.RoPE(D)(q, k, positions)
    theirs = hf_llama(llama.LlamaRotaryEmbedding(config), q, k, positions)
    for a, b in zip(ours, theirs):
        assert a.dtype == torch.bfloat16
        torch.testing.assert_close(a, b, atol=0, rtol=0)


# --- GPT-NeoX: partial rotary --------------------------------------------------------------------

@pytest.mark.parametrize("rotary_pct", [0.25, 0.5, 1.0])
def test_gpt_neox_partial_rotary_matches_hf(rotary_pct):
    config = transformers.GPTNeoXConfig(hidden_size=H * D, num_attention_heads=H, rotary_pct=rotary_pct,
                                        max_position_embeddings=64)
    q, k = qk(6)
    k = k.repeat_interleave(H // HKV, dim=1)  # GPT-NeoX has no GQA: k (B, H, L, D)
    positions = row_positions(6, starts=(2, 30))
    rotary = neox.GPTNeoXRotaryEmbedding(config)
    cos, sin = rotary(q, positions)
    theirs = neox.apply_rotary_pos_emb(q, k, cos, sin)
    by_dim = mh.RoPE(D, rotary_dim=int(D * rotary_pct))
    by_dict = mh.RoPE(D, scaling=copy.deepcopy(config.rope_parameters))
    assert by_dict.rotary_dim == by_dim.rotary_dim == cos.shape[-1]
    for rope in (by_dim, by_dict):
        for a, b in zip(rope(q, k, positions), theirs):
            torch.testing.assert_close(a, b, **FP32)


# --- GPT-J: interleaved pairs, with and without partial rotary ------------------------------------

def gptj_rotate(x, positions, rotary_dim):
    """GPT-J attention's rotary steps on x (B, H, L, D), with transformers' GPT-J functions."""
    x = x.transpose(1, 2)  # (B, H, L, D) -> (B, L, H, D): GPT-J turns heads before moving them forward
    table = gptj.create_sinusoidal_positions(64, rotary_dim)  # (positions, R): [sin | cos]
    sin, cos = torch.split(table[positions], rotary_dim // 2, dim=-1)  # (B, L, R/2) each
    turned = gptj.apply_rotary_pos_emb(x[..., :rotary_dim], sin, cos)
    return torch.cat((turned, x[..., rotary_dim:]), dim=-1).transpose(1, 2)  # back to (B, H, L, D)


@pytest.mark.parametrize("rotary_dim", [4, 8, D])
def test_gptj_interleaved_matches_hf(rotary_dim):
    q, k = qk(5)
    positions = row_positions(5, starts=(0, 17))
    ours = mh.RoPE(D, interleaved=True, rotary_dim=rotary_dim)(q, k, positions)
    torch.testing.assert_close(ours[0], gptj_rotate(q, positions, rotary_dim), **FP32)
    torch.testing.assert_close(ours[1], gptj_rotate(k, positions, rotary_dim), **FP32)


# --- rope scaling --------------------------------------------------------------------------------

SCALINGS = {
    "linear": dict(rope_type="linear", factor=4.0),
    "linear-old-spelling": dict(type="linear", factor=2.0),
    "llama3": dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16),
}


@pytest.mark.parametrize("name", sorted(SCALINGS))
def test_static_scalings_match_hf(name):
    config = llama_config(**copy.deepcopy(SCALINGS[name]), rope_theta=500.0)
    rope = mh.RoPE(D, base=500.0, scaling=copy.deepcopy(SCALINGS[name]))
    hf = llama.LlamaRotaryEmbedding(config)
    torch.testing.assert_close(rope.inv_freq, hf.inv_freq, **FP32)
    q, k = qk(9)
    positions = row_positions(9, starts=(5, 100))
    for a, b in zip(rope(q, k, positions), hf_llama(hf, q, k, positions)):
        torch.testing.assert_close(a, b, **FP32)


# The dynamic NTK state machine: each call's positions (shared or per row) in order. N = 32 here.
DYNAMIC_CALLS = [
    torch.arange(10),                      # inside N: plain RoPE
    torch.arange(50),                      # past N: the base grows for 50
    torch.arange(40),                      # between N and 50: HF keeps the base of 50
    row_positions(3, starts=(55, 20)),     # per row: the batch's longest (58) decides, for every row
    torch.tensor([[58], [23]]),            # one decode step each: still 58
    torch.tensor([[59], [24]]),            # grows to 60
    torch.arange(20),                      # back inside N: plain RoPE again
    torch.arange(33),                      # just past N
]


@pytest.mark.parametrize("source", ["max_position", "dict", "both"])
def test_dynamic_ntk_follows_hf_call_by_call(source):
    rope_dict = dict(rope_type="dynamic", factor=2.0, rope_theta=10000.0)
    if source == "both":  # HF's dynamic NTK reads max_position_embeddings (32) and ignores the dict's 16
        rope_dict["original_max_position_embeddings"] = 16
    config = llama_config(**rope_dict)
    if source == "dict":  # the original length from the dict, no max_position
        rope = mh.RoPE(D, scaling=dict(rope_type="dynamic", factor=2.0, original_max_position_embeddings=32))
    else:
        rope = rope_like(config)
    hf = llama.LlamaRotaryEmbedding(config)
    for positions in DYNAMIC_CALLS:
        L = positions.shape[-1]
        q, k = qk(L, seed=L)
        for a, b in zip(rope(q, k, positions), hf_llama(hf, q, k, positions)):
            torch.testing.assert_close(a, b, **FP32)
        assert int(rope.seen_length) == int(hf.max_seq_len_cached)


def test_dynamic_ntk_partial_rotary_matches_hf():
    config = transformers.GPTNeoXConfig(hidden_size=H * D, num_attention_heads=H, rotary_pct=0.5,
                                        max_position_embeddings=16,
                                        rope_parameters=dict(rope_type="dynamic", factor=3.0, rope_theta=10000.0))
    hf = neox.GPTNeoXRotaryEmbedding(config)
    rope = mh.RoPE(D, scaling=copy.deepcopy(config.rope_parameters), max_position=16)
    assert rope.rotary_dim == D // 2
    q, k = qk(40)
    k = k.repeat_interleave(H // HKV, dim=1)
    positions = torch.arange(40)[None]
    cos, sin = hf(q, positions)
    for a, b in zip(rope(q, k, positions), neox.apply_rotary_pos_emb(q, k, cos, sin)):
        torch.testing.assert_close(a, b, **FP32)
