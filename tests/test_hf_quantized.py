"""use_quantized_cache: any HF decoder's generate over int8 / fp8 keys and values, read by the quantized kernel."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
import multihead.hf
from hf_models import VOCAB, tiny_model
from multihead.hf.quantized import CodedCacheLayer

NEW = 6


def greedy(model, B: int = 2, L: int = 80, **options):
    ids = torch.randint(3, VOCAB, (B, L), generator=torch.Generator().manual_seed(2))
    out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW, min_new_tokens=NEW,
                         do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True, **options)
    return out.sequences, torch.stack(out.logits).float()  # (B, L + NEW), (NEW, B, V)


@pytest.mark.parametrize("kv_dtype, tol", [(torch.int8, 5e-3), (torch.float8_e4m3fn, 2e-2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_generate_over_codes_gives_the_float_caches_tokens_and_close_logits(kv_dtype, tol, dtype):
    model = tiny_model("llama", "sdpa").to(dtype)
    tokens, logits = greedy(model)
    assert multihead.hf.use_quantized_cache(model, kv_dtype=kv_dtype) is model
    with mh.trace() as t:
        ours, our_logits = greedy(model)
    assert torch.equal(ours, tokens)  # the codes' drift flips no greedy token on this model
    assert (our_logits - logits).abs().max() < tol + (0.1 if dtype == torch.bfloat16 else 0)
    reads = [r for r in t if r.backend == "quantized"]
    assert len(reads) == 2 * (NEW - 1) and all(r.dims[2] == 1 and str(kv_dtype) in r.reason for r in reads)
    assert all(r.backend != "quantized" for r in t if r.dims[2] > 1)  # the prompt attends its float keys


def test_the_cache_holds_codes_and_scales_and_follows_beams():
    model = tiny_model("llama")
    tokens, _ = greedy(model, num_beams=2)
    multihead.hf.use_quantized_cache(model, kv_dtype=torch.int8)
    ours, _ = greedy(model, num_beams=2)
    assert torch.equal(ours, tokens)
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.randint(3, VOCAB, (1, 5)), cache=cache)
    layer = cache.layers[0]
    assert isinstance(layer, CodedCacheLayer) and layer.get_seq_length() == 5
    assert layer.store[0].dtype == torch.int8 and layer.store[2].dtype == torch.float32


def test_sliding_window_layers_keep_float_keys_and_tokens_stay_equal():
    model = tiny_model("gemma3")  # a sliding layer and a full one
    tokens, _ = greedy(model, L=70)
    multihead.hf.use_quantized_cache(model, kv_dtype=torch.int8)
    ours, _ = greedy(model, L=70)
    assert torch.equal(ours, tokens)


def test_what_use_quantized_cache_cannot_take_raises():
    model = tiny_model("llama")
    with pytest.raises(mh.AttentionError, match="int8 or torch.float8_e4m3fn"):
        multihead.hf.use_quantized_cache(model, kv_dtype=torch.float16)
    with pytest.raises(mh.AttentionError, match="found none"):
        multihead.hf.use_quantized_cache(torch.nn.Linear(2, 2))
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    ids = torch.randint(3, VOCAB, (1, 5))
    with torch.no_grad():
        model(ids, cache=cache)  # float states first
        multihead.hf.use_quantized_cache(model)
        with pytest.raises(mh.AttentionError, match="starts empty"):
            model(ids[:, :1], cache=cache)
    assert cache.get_seq_length() == 5  # the refused call left the cache as it was
