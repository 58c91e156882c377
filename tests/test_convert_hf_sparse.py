"""MultiHeadLatentAttention.from_module on transformers' DeepSeek V3.2 and GLM-MoE-DSA layers (sparse attention).

Tiny random models (test_convert_hf_latent's sizes, low-rank queries, an indexer of 8 heads of 8 keeping
index_topk = 3 keys): over 9 tokens the selection drops keys from the fourth query on. Forward hooks
capture a layer's input and output inside the model's own forward, first over the prompt, then one
token at a time against HF's cache. The converted layer, fed the same hidden states, gives the same rows
within 1e-5 (fp32): over the whole sequence, and with its latent cache, prefill then single steps.
GLM's "shared" layers attend to the keys the layer before them picked (`indices=`).
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh

pytestmark = pytest.mark.models
transformers = pytest.importorskip("transformers")

from test_convert_hf_latent import PROMPT, SMALL, STEPS, VOCAB, captured_rows  # noqa: E402

TOLERANCE = 1e-5
SPARSE = dict(SMALL, q_lora_rank=12, index_topk=3, index_head_dim=8, index_n_heads=8, n_group=1, topk_group=1)
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "mscale": 1.0, "mscale_all_dim": 0.707,
        "original_max_position_embeddings": 8, "beta_fast": 32.0, "beta_slow": 1.0}
CASES = {  # name: (model type, config overrides, layer)
    "v3.2 layer 0": ("deepseek_v32", {}, 0),
    "v3.2 layer 1": ("deepseek_v32", {}, 1),
    "v3.2 yarn": ("deepseek_v32", {"rope_parameters": YARN}, 1),
    "glm layer 1": ("glm_moe_dsa", {}, 1),
    "glm shared layer": ("glm_moe_dsa", {"indexer_types": ["full", "shared"]}, 1),
}


def sparse_model(model_type: str, seed: int = 0, **overrides):
    """A tiny DeepseekV32ForCausalLM / GlmMoeDsaForCausalLM in eval mode, eager attention, attention weights
    of std 0.15 (norms in [0.5, 1.5])."""
    torch.manual_seed(seed)
    options = {**SPARSE, **overrides}
    if model_type == "deepseek_v32":
        model = transformers.DeepseekV32ForCausalLM(transformers.DeepseekV32Config(**options))
    else:
        model = transformers.GlmMoeDsaForCausalLM(transformers.GlmMoeDsaConfig(**options))
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for layer in model.model.layers:
            for name, param in layer.self_attn.named_parameters():
                param.uniform_(0.5, 1.5) if "norm" in name else param.normal_(0.0, 0.15)
    return model.eval()


def converted_rows(model, layer: int, ids: torch.Tensor):
    """(expected rows, ours over the whole sequence, ours prefill then steps), each (B, L, E), for one layer;
    a shared layer reads the selections of the converted layer before it, computed the same way."""
    seen = captured_rows(model, ids, layer)
    ours = mh.MultiHeadLatentAttention.from_module(model.model.layers[layer].self_attn)
    hidden, expected = torch.cat([x for x, _ in seen], 1), torch.cat([y for _, y in seen], 1)
    with torch.no_grad():
        if not ours.shared_selection:
            cache = ours.new_cache(ids.shape[0], ids.shape[1])
            return expected, ours(hidden), torch.cat([ours(x, cache=cache) for x, _ in seen], 1)
        before = mh.MultiHeadLatentAttention.from_module(model.model.layers[layer - 1].self_attn)
        seen_before = captured_rows(model, ids, layer - 1)
        _, picked = before(torch.cat([x for x, _ in seen_before], 1), return_indices=True)
        caches = [m.new_cache(ids.shape[0], ids.shape[1]) for m in (before, ours)]
        steps = []
        for (x_before, _), (x, _) in zip(seen_before, seen):
            _, step_picks = before(x_before, cache=caches[0], return_indices=True)
            steps.append(ours(x, cache=caches[1], indices=step_picks))
        return expected, ours(hidden, indices=picked), torch.cat(steps, 1)


@pytest.mark.parametrize("case", sorted(CASES))
def test_from_module_equals_hf_prefill_and_step_by_step(case):
    model_type, overrides, layer = CASES[case]
    model = sparse_model(model_type, **overrides)
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    expected, full, steps = converted_rows(model, layer, ids)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(full, expected, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(steps, expected, rtol=0, atol=TOLERANCE)


def test_the_selection_matters_at_these_lengths():
    """With index_topk past the sequence every key is kept: the rows then differ from HF's sparse ones."""
    model = sparse_model("deepseek_v32")
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    seen = captured_rows(model, ids, 1)
    ours = mh.MultiHeadLatentAttention.from_module(model.model.layers[1].self_attn)
    assert ours.indexer.top_k == 3 and ours.indexer.rope.rotary_dim == 4 and not ours.indexer.rope.interleaved
    ours.indexer.top_k = 100
    with torch.no_grad():
        dense = ours(torch.cat([x for x, _ in seen], 1))
    assert (dense - torch.cat([y for _, y in seen], 1)).abs().max() > 1e-2


def test_glm_layers_convert_with_an_interleaved_indexer_or_as_shared():
    model = sparse_model("glm_moe_dsa", indexer_types=["full", "shared"])
    full, shared = (mh.MultiHeadLatentAttention.from_module(layer.self_attn) for layer in model.model.layers)
    assert full.indexer.rope.interleaved and full.indexer.top_k == 3 and not full.shared_selection
    assert shared.indexer is None and shared.shared_selection
    with pytest.raises(mh.AttentionError, match="attends to the keys given as indices="):
        shared(torch.randn(1, 3, 48))


def test_bf16_layer_converts_and_stays_within_twice_hf_drift():
    model = sparse_model("deepseek_v32")
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    seen = captured_rows(model, ids, 1)
    hidden, exact = torch.cat([x for x, _ in seen], 1), torch.cat([y for _, y in seen], 1)
    layer = model.model.layers[1].self_attn.to(torch.bfloat16)
    ours = mh.MultiHeadLatentAttention.from_module(layer)
    L = PROMPT + STEPS
    hf_mask = torch.full((L, L), torch.finfo(torch.bfloat16).min).triu(1).to(torch.bfloat16).expand(2, 1, L, L)
    cos, sin = model.model.rotary_emb(hidden, torch.arange(L)[None])
    with torch.no_grad():
        theirs = layer(hidden.bfloat16(), (cos.bfloat16(), sin.bfloat16()), hf_mask)[0]
        cache = ours.new_cache(2, L)
        steps = torch.cat([ours(x.bfloat16(), cache=cache) for x, _ in seen], 1)
        full = ours(hidden.bfloat16())
    drift = (theirs.float() - exact).abs().max().item()
    assert (full.float() - exact).abs().max().item() <= 2 * drift + 1e-3
    assert (steps.float() - exact).abs().max().item() <= 2 * drift + 1e-3


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_attn_implementation_multihead_attends_to_the_selected_keys(model_type):
    """HF folds the indexer's picks into the mask only for its own eager and sdpa attention and hands any
    other implementation `indices=`: attn_implementation="multihead" must attend to those keys alone, so its
    logits equal eager's over a left-padded batch long enough for the selection to drop keys."""
    import multihead.hf  # noqa: F401  (registers "multihead")

    model = sparse_model(model_type, indexer_types=["full", "shared"]) if model_type == "glm_moe_dsa" \
        else sparse_model(model_type)
    ids = torch.randint(3, VOCAB, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    logits = {}
    for implementation in ("eager", "multihead"):
        model.set_attn_implementation(implementation)
        with torch.no_grad():
            logits[implementation] = model(input_ids=ids, attention_mask=mask).logits
    kept = mask.bool()
    torch.testing.assert_close(logits["multihead"][kept], logits["eager"][kept], rtol=0, atol=1e-5)


def test_hf_indices_attend_through_mask_sparse():
    from multihead.hf.attention import hf_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, n, 8, generator=g) for n in (2, 4, 4))  # (B, H, L, D), HF's layout
    indices = torch.tensor([[[2, 0, -1], [1, -1, -1]]])  # (B=1, Lq=2, K=3)
    out, _ = hf_attention(torch.nn.Module(), q, k, v, None, scaling=0.5, is_causal=False, indices=indices)
    keep = torch.tensor([[True, False, True, False], [False, True, False, False]])
    expected = mh.attention(q, k, v, mh.Mask.keep(keep), scale=0.5, backend="math")
    torch.testing.assert_close(out, expected.transpose(1, 2))
    with pytest.raises(mh.AttentionError, match="int32 or int64"):
        hf_attention(torch.nn.Module(), q, k, v, None, is_causal=False, indices=torch.zeros(1, 2, 3))
