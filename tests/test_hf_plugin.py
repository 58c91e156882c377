"""attn_implementation="multihead" inside transformers' own model classes (tiny random configs, nothing
downloaded) and the packaged all-MiniLM-L6-v2, against each model's own "eager" attention."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

pytestmark = pytest.mark.models
tf = pytest.importorskip("transformers")

import multihead as mh  # noqa: E402
import multihead.hf  # noqa: E402  (registers "multihead")
from multihead.hf import hf_attention  # noqa: E402
from hf_models import FAMILIES, greedy_tokens, left_padded_batch, one_thread, run, tiny_model  # noqa: E402, F401
from transformers import AttentionInterface  # noqa: E402
from transformers.cache_utils import DynamicCache  # noqa: E402
from transformers.masking_utils import (AttentionMaskInterface, create_bidirectional_mask,  # noqa: E402
                                        create_causal_mask, create_sliding_window_causal_mask)


# --- registration ---------------------------------------------------------------------------------------

def test_import_registers_both_interfaces_and_register_is_idempotent():
    for interface, function in ((AttentionInterface, hf_attention), (AttentionMaskInterface, multihead.hf.hf_mask)):
        assert interface._global_mapping["multihead"] is function
    before = (dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping))
    multihead.hf.register()
    assert (dict(AttentionInterface._global_mapping), dict(AttentionMaskInterface._global_mapping)) == before
    try:
        multihead.hf.register("multihead_copy")
        assert AttentionMaskInterface._global_mapping["multihead_copy"] is multihead.hf.hf_mask
    finally:
        AttentionInterface._global_mapping.pop("multihead_copy", None)
        AttentionMaskInterface._global_mapping.pop("multihead_copy", None)
    with pytest.raises(mh.AttentionError, match="non-empty string"):
        multihead.hf.register("")


def test_attention_function_alone_refuses_to_run_without_any_mask():
    """Registered without its mask function, transformers would build no mask at all: that raises."""
    AttentionInterface.register("multihead_attention_only", hf_attention)
    try:
        model = tiny_model("llama")
        model.set_attn_implementation("multihead_attention_only")
        with pytest.raises(mh.AttentionError, match="no mask function"):
            model(input_ids=left_padded_batch()[0])
    finally:
        AttentionInterface._global_mapping.pop("multihead_attention_only", None)


# --- masks: HF's description becomes structure, and means what HF's dense mask means -------------------

def mask_config():
    _, config = FAMILIES["mistral"]()
    config._attn_implementation = "multihead"
    return config


def test_masks_arrive_as_structure():
    config, embeds = mask_config(), torch.zeros(2, 12, 32)
    real = torch.ones(2, 12, dtype=torch.bool)
    padded = real.clone()
    padded[1, :4] = False
    describe = lambda mask: [p.describe() for p in mask.parts]  # noqa: E731
    assert describe(create_causal_mask(config, embeds, real, past_key_values=None)) == ["causal(top_left)"]
    assert describe(create_causal_mask(config, embeds, padded, past_key_values=None)) == [
        "causal(top_left)", "key_padding(2, 12)"]
    assert describe(create_sliding_window_causal_mask(config, embeds, padded, past_key_values=None)) == [
        "window(5, top_left)", "causal(top_left)", "key_padding(2, 12)"]
    assert describe(create_bidirectional_mask(config, embeds, real)) == []  # an empty Mask, never None
    cache = DynamicCache(config=config)
    cache.update(torch.zeros(2, 2, 12, 8), torch.zeros(2, 2, 12, 8), 0)
    step = create_sliding_window_causal_mask(config, torch.zeros(2, 1, 32), torch.cat([padded, real[:, :1]], 1),
                                             past_key_values=cache)
    assert describe(step) == ["window(5, bottom_right)", "causal(bottom_right)"]  # the padding left the window


@pytest.mark.parametrize("builder", ["causal", "sliding", "bidirectional", "packed", "decode", "sliding decode"])
def test_structured_masks_keep_exactly_what_hfs_eager_masks_keep(builder):
    config = mask_config()
    B, L = 2, 12
    padded = torch.ones(B, L, dtype=torch.bool)
    padded[1, :4] = False
    cache, q_len, attention_mask, position_ids = None, L, padded, None
    if builder == "packed":  # position ids restart: transformers' packed-sequence pattern
        attention_mask, position_ids = None, torch.tensor([[0, 1, 2, 0, 1, 2, 3, 4, 0, 1, 2, 3]] * B)
    if "decode" in builder:
        cache = DynamicCache(config=config)
        cache.update(torch.zeros(B, 2, L, 8), torch.zeros(B, 2, L, 8), 0)
        q_len, attention_mask = 1, torch.cat([padded, torch.ones(B, 1, dtype=torch.bool)], 1)
    make = {"causal": create_causal_mask, "sliding": create_sliding_window_causal_mask, "packed": create_causal_mask,
            "bidirectional": create_bidirectional_mask, "decode": create_causal_mask,
            "sliding decode": create_sliding_window_causal_mask}[builder]
    kwargs = dict(config=config, inputs_embeds=torch.zeros(B, q_len, 32), attention_mask=attention_mask)
    kwargs.update({} if builder == "bidirectional" else dict(past_key_values=cache, position_ids=position_ids))
    ours = make(**kwargs)
    if cache is not None:  # the same cache again for the eager mask (mask creation reads, never writes)
        kwargs["past_key_values"] = cache
    config._attn_implementation = "eager"
    theirs = make(**kwargs)  # float (B, 1, Lq, Lk): 0 = attend, dtype min = blocked
    Lk = theirs.shape[-1]
    keep, _ = ours.materialize(B, 1, theirs.shape[-2], Lk)
    keep = torch.ones(1, dtype=torch.bool) if keep is None else keep
    assert torch.equal(torch.broadcast_to(keep, theirs.shape), theirs == 0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_mask_acts_as_hfs_eager_tensor_for_models_that_do_arithmetic_on_it(dtype):
    """Bloom adds the mask to its scores, MPT calls .to(bool) and masked_fill: both get eager's tensor."""
    config = mask_config()
    padded = torch.ones(2, 12, dtype=torch.bool)
    padded[1, :4] = False
    inputs = (torch.zeros(2, 12, 32, dtype=dtype), padded)
    ours = create_sliding_window_causal_mask(config, *inputs, past_key_values=None)
    config._attn_implementation = "eager"
    theirs = create_sliding_window_causal_mask(config, *inputs, past_key_values=None)  # (B, 1, Lq, Lk): 0 or min
    assert (ours.shape, ours.dtype, ours.device, ours.ndim) == (theirs.shape, theirs.dtype, theirs.device, 4)
    scores = torch.randn(2, 4, 12, 12).to(dtype)
    assert torch.equal(scores + ours, scores + theirs) and torch.equal(ours + scores, theirs + scores)
    assert torch.equal(scores - ours, scores - theirs) and torch.equal(ours * 2, theirs * 2)
    assert torch.equal(ours.to(torch.bool), theirs.to(torch.bool))  # MPT: True = blocked
    assert torch.equal(torch.where(ours == 0, scores, -scores), torch.where(theirs == 0, scores, -scores))
    assert torch.equal(ours[:, :, -1:], theirs[:, :, -1:]) and ours.contiguous() is ours
    flat, spec = torch.utils._pytree.tree_flatten(ours)  # generate and torch.compile carry it as a pytree
    again = torch.utils._pytree.tree_unflatten(flat, spec)
    assert type(again) is type(ours) and torch.equal(again + scores, theirs + scores)
    assert torch.equal(copy.deepcopy(ours) + scores, theirs + scores)


# --- parity with eager: every family in test_hf_families.py; here the real MiniLM weights ---------------

def test_minilm_with_its_real_weights_equals_eager(minilm):
    tokenizer, _ = minilm
    path = tokenizer.name_or_path
    models = {name: tf.AutoModel.from_pretrained(path, local_files_only=True, attn_implementation=name).eval()
              for name in ("eager", "multihead")}
    sentences = ["multi-head attention splits the model width into heads", "a short one", "padding comes first"]
    for side in ("right", "left"):
        batch = tokenizer(sentences, padding=True, padding_side=side, return_tensors="pt")
        assert not batch["attention_mask"].all()
        real = batch["attention_mask"].bool()
        with torch.no_grad():
            eager = models["eager"](**batch, output_attentions=True)
            fast = models["multihead"](**batch).last_hidden_state
            ours = models["multihead"](**batch, output_attentions=True)
        assert (fast - eager.last_hidden_state)[real].abs().max() < 1e-5
        assert (ours.last_hidden_state - eager.last_hidden_state)[real].abs().max() < 1e-5
        for got, expected in zip(ours.attentions, eager.attentions):
            assert (got - expected).transpose(1, 2)[real].abs().max() < 1e-6


# --- the attention function on its own ----------------------------------------------------------------------

class Stub(nn.Module):
    """What the attention function reads from an HF attention module."""

    def __init__(self, is_causal: bool):
        super().__init__()
        self.is_causal = is_causal


def qkv(Lq: int = 5, Lk: int = 7):
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 4, Lq, 8, generator=g), torch.randn(2, 2, Lk, 8, generator=g), torch.randn(2, 2, Lk, 8, generator=g)


def test_without_a_mask_the_modules_is_causal_and_window_decide():
    q, k, v = qkv()
    out, weights = hf_attention(Stub(True), q, k, v, None, sliding_window=3)
    expected = mh.attention(q, k, v, mh.Mask.causal("bottom_right") & mh.Mask.window(3, "bottom_right"))
    assert weights is None and torch.equal(out, expected.transpose(1, 2))
    out, _ = hf_attention(Stub(False), q, k, v, None, scaling=0.5)
    assert torch.equal(out, mh.attention(q, k, v, scale=0.5).transpose(1, 2))


def test_four_d_tensor_masks_follow_hfs_conventions():
    q, k, v = qkv()
    keep = torch.rand(2, 1, 5, 7, generator=torch.Generator().manual_seed(1)) > 0.3
    out, _ = hf_attention(Stub(True), q, k, v, keep)  # bool: True = attend (HF's sdpa masks)
    assert torch.equal(out, mh.attention(q, k, v, mh.Mask.keep(keep)).transpose(1, 2))
    additive = torch.zeros(2, 1, 5, 7).masked_fill(~keep, torch.finfo(torch.float32).min)  # HF's eager masks
    out, weights = hf_attention(Stub(True), q, k, v, additive, output_attentions=True)
    assert torch.allclose(out, mh.attention(q, k, v, mh.Mask.additive(additive)).transpose(1, 2), atol=1e-6)
    assert torch.equal(weights == 0, ~keep.expand(2, 4, 5, 7))


@pytest.mark.parametrize("mask, kwargs, expected", [
    (torch.ones(2, 7, dtype=torch.bool), {}, "4-D"),
    ("causal", {}, "Mask, a 4-D tensor or None"),
    (None, {"position_bias": torch.zeros(1)}, "position_bias"),
])
def test_what_the_attention_function_cannot_honour_raises(mask, kwargs, expected):
    with pytest.raises(mh.AttentionError, match=expected):
        hf_attention(Stub(True), *qkv(), mask, **kwargs)


def test_a_model_compiles_as_one_graph_with_multihead():
    """Gemma 2: softcap, a sliding-window layer and a full one, left padding; fullgraph=True, one frame."""
    from torch._dynamo.testing import CompileCounterWithBackend

    model = tiny_model("gemma2")
    ids, mask = left_padded_batch()
    eager = run(model, "eager", input_ids=ids, attention_mask=mask).logits
    model.set_attn_implementation("multihead")
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True)
    with torch.no_grad():
        logits = compiled(input_ids=ids, attention_mask=mask).logits
    assert counter.frame_count == 1
    assert (logits - eager)[mask.bool()].abs().max() < 1e-5


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_generation_with_a_static_cache_gives_the_same_tokens(name):
    """generate prepares the masks ahead for static caches and feeds them back in as attention_mask."""
    tokens = greedy_tokens(tiny_model(name), 16, cache_implementation="static")
    assert torch.equal(tokens["multihead"], tokens["eager"])
