"""attn_implementation="multihead" against each model's own "eager" attention, family by family.

One tiny random-weight model per family (tests/hf_models.py: ALiBi, MLA, hybrid linear/full, softcap,
sliding windows, sinks, differential, chunked, an encoder, GQA/MQA, experts, ...), a left-padded batch:
logits (or hidden states) equal, the attention weights of output_attentions=True equal, and greedy
generation gives the same tokens. Bloom and MPT write their attention themselves and add the mask
the interface hands them to their ALiBi scores; there the mask must behave as HF's eager tensor.
"""
from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.models
pytest.importorskip("transformers")

import multihead as mh  # noqa: E402
import multihead.hf  # noqa: E402, F401  (registers "multihead")
from multihead.hf import hf_mask  # noqa: E402
from multihead.hf.prepared_mask import PreparedMask  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface  # noqa: E402
from hf_models import (ENCODERS, FAMILIES, MASK_ONLY, generate, left_padded_batch, one_thread,  # noqa: E402, F401
                       run, tiny_model)

NEW_TOKENS = 16
OUTPUT_TOLERANCE = 1e-5  # measured: at most 2.4e-7 (fp32, the fast path); with output_attentions, 0
WEIGHTS_TOLERANCE = 1e-6  # measured: 0 (the weights come from the same reference math as eager's)


def output(result, name: str) -> torch.Tensor:
    return result.last_hidden_state if name in ENCODERS else result.logits


def twins(name: str) -> dict:
    """{implementation: the family's model built with it}, the same weights (some models cannot switch)."""
    return {implementation: tiny_model(name, implementation) for implementation in ("eager", "multihead")}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_outputs_and_attention_weights_equal_eager_on_a_left_padded_batch(name, monkeypatch):
    models = twins(name)
    ids, mask = left_padded_batch()
    real = mask.bool()  # padding positions attend to nothing: eager gives them arbitrary rows, ours zeros
    eager = run(models["eager"], input_ids=ids, attention_mask=mask, output_attentions=True)
    masks = []  # what multihead's mask function returned during the call
    monkeypatch.setitem(AttentionMaskInterface._global_mapping, "multihead",
                        lambda *args, **kwargs: masks.append(hf_mask(*args, **kwargs)) or masks[-1])
    with mh.capture_attention() as record:
        fast = run(models["multihead"], input_ids=ids, attention_mask=mask)
    assert masks and all(isinstance(m, PreparedMask) for m in masks)
    if name in MASK_ONLY:
        assert len(record) == 0  # the model's own attention code ran, on the mask multihead built
    else:
        assert len(record) >= 1  # multihead ran (Qwen3-Next: its one full-attention layer)
    assert (output(fast, name) - output(eager, name))[real].abs().max() <= OUTPUT_TOLERANCE
    ours = run(models["multihead"], input_ids=ids, attention_mask=mask, output_attentions=True)
    assert (output(ours, name) - output(eager, name))[real].abs().max() <= OUTPUT_TOLERANCE
    pairs = [(got, expected) for got, expected in zip(ours.attentions, eager.attentions) if expected is not None]
    assert len(ours.attentions) == len(eager.attentions) and pairs
    for got, expected in pairs:  # (B, H, Lq, Lk); compare real query rows
        assert got.shape == expected.shape
        assert (got - expected).transpose(1, 2)[real].abs().max() <= WEIGHTS_TOLERANCE


@pytest.mark.parametrize("name", [name for name in FAMILIES if name not in ENCODERS])
def test_greedy_generation_gives_the_same_tokens(name):
    tokens = {implementation: generate(model, NEW_TOKENS) for implementation, model in twins(name).items()}
    assert tokens["eager"].shape == (3, 12 + NEW_TOKENS)
    assert torch.equal(tokens["multihead"], tokens["eager"])
