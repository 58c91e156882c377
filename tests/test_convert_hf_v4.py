"""SharedKVAttention.from_module on transformers' DeepSeek V4 layers: sliding, compressed-sparse, heavily compressed.

A tiny random DeepseekV4ForCausalLM (hidden 32, 4 heads of 16 with the last 4 features turned, window 4,
CSA blocks of 2 with an indexer keeping 2 of up to 7 blocks, HCA blocks of 3; every attention weight,
gate bias and sink drawn). Forward hooks capture each layer's input and output inside the model's own
forward, over a prompt of 7 tokens (an unfinished block left over), then one token at a time against HF's
cache. The converted layer, fed the same hidden states, gives the same rows within 1e-5 (fp32): over the
whole sequence, and with its SharedKVCache, prefill then single steps.
"""
from __future__ import annotations

import copy

import pytest
import torch

import multihead as mh

pytestmark = pytest.mark.models
transformers = pytest.importorskip("transformers")

TOLERANCE = 1e-5
VOCAB, PROMPT, STEPS = 64, 7, 7
LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention"]
SMALL = dict(vocab_size=VOCAB, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=3, num_attention_heads=4,
             head_dim=16, q_lora_rank=12, partial_rotary_factor=0.25, n_routed_experts=4, num_experts_per_tok=2,
             hc_mult=2, layer_types=LAYER_TYPES, sliding_window=4, o_groups=2, o_lora_rank=8, index_n_heads=8,
             index_head_dim=8, index_topk=2, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
             eos_token_id=2, compress_rates={"compressed_sparse_attention": 2, "heavily_compressed_attention": 3})


def v4_model(seed: int = 0):
    """The tiny DeepseekV4ForCausalLM in eval mode, attention weights N(0, 0.3), norms in [0.5, 1.5], gate
    biases and sinks N(0, 1) (transformers starts both at zero)."""
    torch.manual_seed(seed)
    model = transformers.DeepseekV4ForCausalLM(transformers.DeepseekV4Config(**SMALL))
    with torch.no_grad():
        for layer in model.model.layers:
            for name, param in layer.self_attn.named_parameters():
                if "norm" in name:
                    param.uniform_(0.5, 1.5)
                else:
                    param.normal_(0.0, 1.0 if name.endswith(("position_bias", "sinks")) else 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def captured():
    """(model, {layer index: [(hidden_states, output)] for the prompt, then each step})."""
    model = v4_model()
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    seen = {i: [] for i in range(3)}
    hooks = [layer.self_attn.register_forward_hook(
        lambda m, args, kwargs, out, i=i: seen[i].append((args[0] if args else kwargs["hidden_states"], out[0])),
        with_kwargs=True) for i, layer in enumerate(model.model.layers)]
    try:
        with torch.no_grad():
            cache = model(ids[:, :PROMPT], use_cache=True).cache
            for i in range(PROMPT, PROMPT + STEPS):
                cache = model(ids[:, i:i + 1], cache=cache, use_cache=True).cache
    finally:
        for hook in hooks:
            hook.remove()
    return model, seen


@pytest.mark.parametrize("door", ["SharedKVAttention", "MultiHeadAttention"])
@pytest.mark.parametrize("layer", [0, 1, 2], ids=LAYER_TYPES)
def test_from_module_equals_hf_prefill_and_step_by_step(captured, layer, door):
    """Both doors: MultiHeadAttention.from_module gives the variant's own class, as for gated attention."""
    model, seen = captured
    ours = getattr(mh, door).from_module(model.model.layers[layer].self_attn)
    assert isinstance(ours, mh.SharedKVAttention)
    assert ours.layer_type == ["sliding", "compressed_sparse", "heavily_compressed"][layer] and not ours.training
    hidden = torch.cat([x for x, _ in seen[layer]], 1)
    expected = torch.cat([y for _, y in seen[layer]], 1)
    assert expected.abs().max() > 1.0
    cache = ours.new_cache(2, PROMPT + STEPS)
    with torch.no_grad():
        torch.testing.assert_close(ours(hidden), expected, rtol=0, atol=TOLERANCE)
        steps = torch.cat([ours(x, cache=cache) for x, _ in seen[layer]], 1)
    torch.testing.assert_close(steps, expected, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("layer", [0, 1, 2], ids=LAYER_TYPES)
def test_bf16_layer_converts_and_stays_within_twice_hf_drift(captured, layer):
    """HF's own layer in bf16 (no cache) sets the drift. Both keep every CSA block here: at bf16 near ties the
    indexer may pick other blocks than in fp32, in HF's layer as in ours."""
    model, seen = captured
    hidden, exact = torch.cat([x for x, _ in seen[layer]], 1), torch.cat([y for _, y in seen[layer]], 1)
    theirs = copy.deepcopy(model.model.layers[layer].self_attn).to(torch.bfloat16)  # the fixture's model stays fp32
    if theirs.compressor is not None and hasattr(theirs.compressor, "indexer"):
        theirs.compressor.indexer.index_topk = 100
    ours = mh.SharedKVAttention.from_module(theirs)
    if ours.indexer is not None:
        ours.indexer.top_k = 100
    L, x = PROMPT + STEPS, hidden.bfloat16()
    positions = torch.arange(L)[None]
    angles = {kind: tuple(t.bfloat16() for t in model.model.rotary_emb(x, positions, layer_type=kind))
              for kind in ("main", "compress")}
    window = torch.arange(L)[None, :] > torch.arange(L)[:, None] - SMALL["sliding_window"]
    mask = torch.zeros(L, L).masked_fill(~(window & torch.ones(L, L, dtype=torch.bool).tril()), float("-inf"))
    with torch.no_grad():
        reference = theirs(x, angles, positions, mask.expand(2, 1, L, L).bfloat16())[0]
        cache = ours.new_cache(2, L)
        steps = torch.cat([ours(h.bfloat16(), cache=cache) for h, _ in seen[layer]], 1)
        full = ours(x)
    drift = (reference.float() - exact).abs().max().item()
    assert drift > 0  # bf16 really rounds here
    for rows in (full, steps):
        assert (rows.float() - exact).abs().max().item() <= 2 * drift + 1e-3


def test_other_modules_are_refused():
    with pytest.raises(mh.AttentionError, match="expects a DeepSeek V4 attention layer"):
        mh.SharedKVAttention.from_module(torch.nn.Linear(4, 4))
