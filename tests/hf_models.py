"""Tiny random-weight transformers models, one per family, for the tests of attn_implementation="multihead".

Each family is chosen for what its attention adds (see FAMILIES). Nothing is downloaded: the models
are built from small configs (2 layers, width 32, vocabulary 97) with a fixed seed.
"""
from __future__ import annotations

import pytest
import torch
import transformers as tf
from torch import nn

VOCAB = 97
SMALL = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
ROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}
TWO_KINDS = ["sliding_attention", "full_attention"]  # one layer of each


def _deepseek_v3():  # MLA: low-rank q and kv, a rope part and a no-rope part of each head
    return tf.DeepseekV3ForCausalLM, tf.DeepseekV3Config(
        **SMALL, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=8, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=16,
        first_k_dense_replace=1, **ROPE)


def _qwen3_next():  # hybrid: a gated delta-rule linear-attention layer and a full-attention layer
    return tf.Qwen3NextForCausalLM, tf.Qwen3NextConfig(
        **SMALL, num_key_value_heads=2, head_dim=8, layer_types=["linear_attention", "full_attention"],
        linear_num_value_heads=2, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
        num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16, shared_expert_intermediate_size=16)


FAMILIES = {  # name: () -> (model class, config); what the family adds to attention
    "llama": lambda: (tf.LlamaForCausalLM, tf.LlamaConfig(**SMALL, num_key_value_heads=4)),
    "mistral": lambda: (tf.MistralForCausalLM, tf.MistralConfig(**SMALL, num_key_value_heads=2, sliding_window=5)),
    "qwen2": lambda: (tf.Qwen2ForCausalLM, tf.Qwen2Config(**SMALL, num_key_value_heads=1)),  # GQA, one kv head
    "qwen3": lambda: (tf.Qwen3ForCausalLM, tf.Qwen3Config(**SMALL, num_key_value_heads=2, head_dim=8)),  # q/k norm
    "gemma2": lambda: (tf.Gemma2ForCausalLM, tf.Gemma2Config(  # softcap; a sliding and a full layer
        **SMALL, num_key_value_heads=2, head_dim=8, sliding_window=5, attn_logit_softcapping=5.0,
        query_pre_attn_scalar=8, final_logit_softcapping=None)),
    "gemma3": lambda: (tf.Gemma3ForCausalLM, tf.Gemma3TextConfig(  # sliding and full layers, two rope bases
        **SMALL, num_key_value_heads=2, head_dim=8, sliding_window=5, layer_types=TWO_KINDS, query_pre_attn_scalar=8)),
    "gpt2": lambda: (tf.GPT2LMHeadModel, tf.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4,
                                                        n_positions=128, bos_token_id=1, eos_token_id=2)),
    "gpt_neox": lambda: (tf.GPTNeoXForCausalLM, tf.GPTNeoXConfig(  # partial rotary
        **SMALL, rotary_pct=0.5, use_parallel_residual=True)),
    "gpt_oss": lambda: (tf.GptOssForCausalLM, tf.GptOssConfig(  # learned sink logits
        **SMALL, num_key_value_heads=2, head_dim=8, num_local_experts=2, num_experts_per_tok=1, sliding_window=5,
        layer_types=TWO_KINDS, **ROPE)),
    "bloom": lambda: (tf.BloomForCausalLM, tf.BloomConfig(  # ALiBi added to the mask by the model itself
        vocab_size=VOCAB, hidden_size=32, n_layer=2, n_head=4, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        initializer_range=0.3)),
    "mpt": lambda: (tf.MptForCausalLM, tf.MptConfig(  # ALiBi; the mask as a bool through masked_fill
        vocab_size=VOCAB, d_model=32, n_layers=2, n_heads=4, max_seq_len=128, expansion_ratio=2,
        initializer_range=0.3)),
    "deepseek_v3": _deepseek_v3,
    "qwen3_next": _qwen3_next,
    "diffllama": lambda: (tf.DiffLlamaForCausalLM, tf.DiffLlamaConfig(  # differential: two softmaxes subtracted
        **SMALL, num_key_value_heads=2)),
    "llama4_text": lambda: (tf.Llama4ForCausalLM, tf.Llama4TextConfig(  # chunked attention on the rope layers
        **SMALL, num_key_value_heads=2, head_dim=8, intermediate_size_mlp=64, num_local_experts=2,
        num_experts_per_tok=1, attention_chunk_size=4, no_rope_layers=[1, 0], moe_layers=[1],
        attn_temperature_tuning=True, floor_scale=4)),
    "phi3": lambda: (tf.Phi3ForCausalLM, tf.Phi3Config(**SMALL, num_key_value_heads=2)),  # fused qkv
    "cohere2": lambda: (tf.Cohere2ForCausalLM, tf.Cohere2Config(  # sliding layers with rope, full without
        **SMALL, num_key_value_heads=2, sliding_window=5, layer_types=TWO_KINDS, logit_scale=1.0)),
    "mixtral": lambda: (tf.MixtralForCausalLM, tf.MixtralConfig(  # experts; sliding window
        **SMALL, num_key_value_heads=2, num_local_experts=2, num_experts_per_tok=1, sliding_window=5)),
    "olmoe": lambda: (tf.OlmoeForCausalLM, tf.OlmoeConfig(  # q/k norm over all heads
        **SMALL, num_key_value_heads=2, num_experts=2, num_experts_per_tok=1)),
    "bert": lambda: (tf.BertModel, tf.BertConfig(  # an encoder: bidirectional with padding
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=128, pad_token_id=0)),
}
ENCODERS = {"bert"}
MASK_ONLY = {"bloom", "mpt"}  # attention written in the model, not through the interface: only the mask is ours


def tiny_model(name: str, implementation: str = "eager") -> nn.Module:
    """The family's model built with `implementation`, eval mode, seeded (the same weights whatever the
    implementation); sink logits (zero at init) drawn so that they matter."""
    model_class, config = FAMILIES[name]()
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation=implementation).eval()
    assert model.config._attn_implementation == implementation
    with torch.no_grad():
        for module in model.modules():
            if isinstance(getattr(module, "sinks", None), nn.Parameter):
                module.sinks.normal_()
    return model


def left_padded_batch(B: int = 3, L: int = 12):
    """(input_ids, attention_mask) with rows 1 and 2 left-padded by 4 and 9 tokens."""
    ids = torch.randint(3, VOCAB, (B, L), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(B, L, dtype=torch.long)
    mask[1, :4] = 0
    mask[2, :9] = 0
    return ids, mask


def switch(model, implementation: str) -> None:
    """model.set_attn_implementation(implementation), checked: models that write their attention
    themselves (Bloom, MPT) refuse to switch with a warning, and a silent refusal would compare eager
    with itself. Build those with tiny_model(name, implementation) instead."""
    model.set_attn_implementation(implementation)
    assert model.config._attn_implementation == implementation, f"{type(model).__name__} did not switch"


def run(model, implementation: str | None = None, **inputs):
    """model(**inputs) without grad, after switching to `implementation` (None: as built)."""
    if implementation is not None:
        switch(model, implementation)
    with torch.no_grad():
        return model(**inputs)


def generate(model, new: int, **options) -> torch.Tensor:
    """(B, L + new): `new` greedy tokens after the left-padded batch."""
    ids, mask = left_padded_batch()
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new,
                          do_sample=False, pad_token_id=0, **options)


def greedy_tokens(model, new: int, **options) -> dict:
    """{"eager": tokens, "multihead": tokens}: `new` greedy tokens after the left-padded batch, both ways."""
    tokens = {}
    for implementation in ("eager", "multihead"):
        switch(model, implementation)
        tokens[implementation] = generate(model, new, **options)
    return tokens


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matrices: threads only add synchronisation (and stall on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
