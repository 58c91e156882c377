"""mh.hf.use_latent_cache: a transformers DeepSeek model generates the same tokens with multihead's latent caches."""
from __future__ import annotations

import pytest
import torch

import multihead as mh

pytestmark = pytest.mark.models
transformers = pytest.importorskip("transformers")

import multihead.hf  # noqa: E402  (needs transformers)
import multihead.hf.latent as hf_latent  # noqa: E402
from test_convert_hf_latent import VOCAB, deepseek_model  # noqa: E402
from test_convert_hf_sparse import sparse_model  # noqa: E402

NEW = 12


def left_padded_batch():
    """(input_ids (3, 10), attention_mask) with rows 1 and 2 left-padded by 3 and 7 tokens."""
    ids = torch.randint(3, VOCAB, (3, 10), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :7] = 0
    return ids, mask


def generate(model, **options):
    ids, mask = left_padded_batch()
    return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False,
                          pad_token_id=0, **options)


@pytest.mark.parametrize("version,overrides",
                         [pytest.param("v2", {}, marks=pytest.mark.slow), ("v3", {"q_lora_rank": 12})])
def test_greedy_tokens_identical_to_hf(version, overrides, monkeypatch):
    monkeypatch.setattr(hf_latent, "FIRST_CAPACITY", 4)  # the latent caches grow several times on the way
    model = deepseek_model(version, **overrides)
    expected = generate(model)
    assert mh.hf.use_latent_cache(model) is model
    swapped = [layer.self_attn for layer in model.model.layers]
    assert all(isinstance(attn, hf_latent.LatentAttention) for attn in swapped)
    assert torch.equal(generate(model), expected)


@pytest.mark.parametrize("model_type,overrides", [("deepseek_v32", {}),
                                                   ("glm_moe_dsa", {"indexer_types": ["full", "shared"]})])
def test_sparse_models_generate_hfs_greedy_tokens(model_type, overrides, monkeypatch):
    """DeepSeek V3.2 and GLM-MoE-DSA (a shared layer reading the first layer's picks), index_topk 3 of up to
    22 keys, left-padded: the same tokens as transformers' own layers."""
    monkeypatch.setattr(hf_latent, "FIRST_CAPACITY", 4)
    model = sparse_model(model_type, **overrides)
    expected = generate(model)
    mh.hf.use_latent_cache(model)
    assert all(isinstance(layer.self_attn, hf_latent.LatentAttention) for layer in model.model.layers)
    assert torch.equal(generate(model), expected)
    ids, mask = left_padded_batch()
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    assert cache.layers[0].latent.index_keys.shape[-1] == 8  # the indexer's keys, beside the latents
    if model_type == "glm_moe_dsa":
        assert cache.layers[1].latent.index_keys is None  # the shared layer keeps none
    model.model.layers[0].self_attn.mla.indexer.top_k = 100  # every key: the tokens change, so selection mattered
    assert not torch.equal(generate(model), expected)


def test_beams_and_several_sequences_per_prompt():
    model = deepseek_model("v3")
    expected = generate(model, num_beams=2, num_return_sequences=2)
    mh.hf.use_latent_cache(model)
    assert torch.equal(generate(model, num_beams=2, num_return_sequences=2), expected)


def test_logits_and_the_cache_layers():
    model = deepseek_model("v3")
    ids, mask = left_padded_batch()
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        mh.hf.use_latent_cache(model)
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    torch.testing.assert_close(out.logits, expected, rtol=0, atol=1e-5)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    assert all(isinstance(layer, hf_latent.LatentLayer) for layer in cache.layers)
    assert cache.get_seq_length() == 10
    assert cache.layers[0].latent.latents.shape[-1] == 16  # (B, M, C): latents, not per-head keys
    cache.reset()
    assert cache.get_seq_length() == 0


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_quantized_latent_caches_through_generate(kv_dtype, monkeypatch):
    """use_latent_cache(kv_dtype=...): the latents as codes under the model's 4-D mask (left padding); the
    prompt's logits within the quantization's drift of HF's, and generate runs with caches grown by resized."""
    monkeypatch.setattr(hf_latent, "FIRST_CAPACITY", 4)
    model = deepseek_model("v3", q_lora_rank=12)
    ids, mask = left_padded_batch()
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask).logits
        mh.hf.use_latent_cache(model, kv_dtype=kv_dtype)
        out = model(input_ids=ids, attention_mask=mask, use_cache=True)
    cache = out.past_key_values if hasattr(out, "past_key_values") else out.cache
    assert all(layer.latent.kv_dtype is kv_dtype for layer in cache.layers)
    drift = ((out.logits - expected).abs().max() / expected.abs().max()).item()
    assert 0 < drift <= (0.02 if kv_dtype is torch.int8 else 0.08)
    tokens = generate(model)  # runs through the grown caches (a random model's greedy tokens flip at any drift)
    assert tokens.shape == (3, 10 + NEW) and torch.equal(tokens[:, :10], ids)


def test_quantized_latent_caches_are_refused_for_layers_that_select_keys():
    model = sparse_model("deepseek_v32")
    with pytest.raises(mh.AttentionError, match="dense MLA layers"):
        mh.hf.use_latent_cache(model, kv_dtype=torch.int8)
    with pytest.raises(mh.AttentionError, match="torch.int8 or torch.float8_e4m3fn"):
        mh.hf.use_latent_cache(deepseek_model("v3"), kv_dtype=torch.float16)


def test_other_models_are_refused():
    with pytest.raises(mh.AttentionError, match="found no such attention layer"):
        mh.hf.use_latent_cache(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    with pytest.raises(mh.AttentionError, match="holds multihead latents"):
        hf_latent.LatentLayer().update(torch.zeros(1), torch.zeros(1))
