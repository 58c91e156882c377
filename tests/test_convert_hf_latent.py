"""MultiHeadLatentAttention.from_module on transformers' DeepSeek V2 and V3 attention layers.

Each case builds a two-layer model from a tiny random config with transformers' own classes (nothing
downloads: hidden 48, 4 heads, latent 16, nope 8, rope 4, v 6; V2 and V3 with and without low-rank
queries, V3 with both rotary layouts), its weights drawn larger than HF's init so that scores spread
out. Forward hooks capture the second layer's attention input and output inside the model's own forward,
first over the prompt, then one token at a time against HF's own DynamicCache (one case with DeepSeek V3's
YaRN scaling). The converted layer, fed
the same hidden states, must give the same rows within 1e-5 (fp32): over the whole sequence, and with
its latent cache, prefill then single steps (absorbed).
"""
from __future__ import annotations

import math

import pytest
import torch

import multihead as mh
from multihead.convert.hf.latent import softmax_scale

pytestmark = pytest.mark.models
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-5
VOCAB, PROMPT, STEPS = 64, 5, 4
SMALL = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
             v_head_dim=6, max_position_embeddings=128, n_routed_experts=4, num_experts_per_tok=2,
             first_k_dense_replace=1, pad_token_id=0, bos_token_id=1, eos_token_id=2,
             q_lora_rank=None)  # transformers' default is 1536: low-rank queries; the cases ask for them
CASES = {
    "v2": ("v2", {}),
    "v2-q-lora": ("v2", {"q_lora_rank": 12}),
    "v3": ("v3", {}),
    "v3-q-lora": ("v3", {"q_lora_rank": 12}),
    "v3-half-split": ("v3", {"rope_interleave": False}),
    # DeepSeek V3's released RoPE: YaRN past 8 positions, an attention factor from unequal mscales
    "v3-yarn": ("v3", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0,
                                           "mscale_all_dim": 0.707, "original_max_position_embeddings": 8,
                                           "beta_fast": 32.0, "beta_slow": 1.0}}),
}


def deepseek_model(version: str, seed: int = 0, **overrides):
    """A tiny DeepseekV2/V3ForCausalLM in eval mode, eager attention, attention weights of std 0.15."""
    torch.manual_seed(seed)
    options = {**SMALL, **overrides}
    if version == "v3":
        config = transformers.DeepseekV3Config(n_group=1, topk_group=1, **options)
        model = transformers.DeepseekV3ForCausalLM(config)
    else:
        model = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**options))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for layer in model.model.layers:
            for name, param in layer.self_attn.named_parameters():
                if "layernorm" in name:
                    param.uniform_(0.5, 1.5)
                else:
                    param.normal_(0.0, 0.15)
    return model.eval()


def captured_rows(model, ids: torch.Tensor, layer: int = 1):
    """[(hidden_states, output)] of layers[layer].self_attn: the prompt, then each next token on HF's cache."""
    seen = []
    hook = model.model.layers[layer].self_attn.register_forward_hook(
        lambda m, args, kwargs, out: seen.append((kwargs["hidden_states"], out[0])), with_kwargs=True)
    try:
        with torch.no_grad():
            cache = model(ids[:, :PROMPT], use_cache=True).past_key_values
            for i in range(PROMPT, ids.shape[1]):
                cache = model(ids[:, i:i + 1], cache=cache, use_cache=True).past_key_values
    finally:
        hook.remove()
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_module_equals_hf_prefill_and_step_by_step(case):
    version, overrides = CASES[case]
    model = deepseek_model(version, **overrides)
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    seen = captured_rows(model, ids)
    ours = mh.MultiHeadLatentAttention.from_module(model.model.layers[1].self_attn)
    assert ours.causal and not ours.training
    hidden = torch.cat([x for x, _ in seen], dim=1)
    expected = torch.cat([y for _, y in seen], dim=1)
    assert expected.abs().max() > 0.1  # weights large enough that a mistake shows
    cache = ours.new_cache(2, PROMPT + STEPS)
    with torch.no_grad():
        torch.testing.assert_close(ours(hidden), expected, rtol=0, atol=TOLERANCE)
        steps = torch.cat([ours(x, cache=cache) for x, _ in seen], dim=1)
    torch.testing.assert_close(steps, expected, rtol=0, atol=TOLERANCE)


def test_softmax_scale_follows_yarn_mscale_as_hf_does():
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}
    config = transformers.DeepseekV3Config(**{**SMALL, "rope_parameters": yarn}, n_group=1, topk_group=1)
    layer = transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3Attention(config, layer_idx=0)
    mscale = 0.1 * 0.707 * math.log(40.0) + 1.0
    assert softmax_scale(12, config.rope_parameters) == pytest.approx(12 ** -0.5 * mscale ** 2, rel=1e-12)
    assert softmax_scale(12, config.rope_parameters) == pytest.approx(layer.scaling, rel=1e-12)
    assert softmax_scale(12, {"rope_type": "default", "rope_theta": 1e4}) == 12 ** -0.5
    assert mh.MultiHeadLatentAttention.from_module(layer).rope.scaling.kind == "yarn"  # equal to HF: case v3-yarn


def test_multihead_attention_from_module_names_the_class_that_converts_deepseek():
    layer = deepseek_model("v2").model.layers[0].self_attn
    with pytest.raises(mh.AttentionError, match=r"Convert it with mh.MultiHeadLatentAttention.from_module\(layer\)"):
        mh.MultiHeadAttention.from_module(layer)


def test_other_modules_are_refused():
    with pytest.raises(mh.AttentionError, match="expects a DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention layer"):
        mh.MultiHeadLatentAttention.from_module(torch.nn.Linear(4, 4))


def test_bf16_layer_converts_and_stays_within_twice_hf_drift():
    model = deepseek_model("v3", q_lora_rank=12)
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    seen = captured_rows(model, ids)
    hidden = torch.cat([x for x, _ in seen], dim=1)
    exact = torch.cat([y for _, y in seen], dim=1)
    layer = model.model.layers[1].self_attn.to(torch.bfloat16)
    ours = mh.MultiHeadLatentAttention.from_module(layer)
    assert ours.kv_b_proj.weight.dtype == torch.bfloat16
    hf_mask = torch.full((PROMPT + STEPS,) * 2, float("-inf")).triu(1)[None, None].to(torch.bfloat16)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(PROMPT + STEPS)[None])
    with torch.no_grad():
        theirs = layer(hidden.bfloat16(), (cos.bfloat16(), sin.bfloat16()), hf_mask)[0]
        cache = ours.new_cache(2, PROMPT + STEPS)
        steps = torch.cat([ours(x.bfloat16(), cache=cache) for x, _ in seen], dim=1)
    drift = (theirs.float() - exact).abs().max().item()
    assert (ours(hidden.bfloat16()).float() - exact).abs().max().item() <= 2 * drift + 1e-3
    assert (steps.float() - exact).abs().max().item() <= 2 * drift + 1e-3
