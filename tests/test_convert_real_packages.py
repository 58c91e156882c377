"""from_module on other people's real code: d2l, labml-nn, and the pretrained all-MiniLM-L6-v2.

The packages come from the `models` extra (scripts/install-test-deps.sh); each test skips when its
package is missing. Everything runs in float64, so outputs and gradients agree to ~1e-10.
"""
from __future__ import annotations

import copy

import pytest
import torch

import multihead as mh
from helpers import assert_same_forward_backward, randn64

pytestmark = pytest.mark.models

B, LQ, LK = 3, 4, 6  # batch, query length, key length


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


# --- d2l ------------------------------------------------------------------------------------------

def test_d2l_lazy_module_must_run_once_before_converting(d2l_torch):
    source = d2l_torch.MultiHeadAttention(num_hiddens=12, num_heads=3, dropout=0.0)
    with pytest.raises(mh.AttentionError, match="LazyLinear.*forward once"):
        mh.MultiHeadAttention.from_module(source)


@pytest.mark.parametrize("lens_shape", ["(B,)", "(B, Lq)"])
def test_d2l_multihead_attention_converts_under_valid_lens(d2l_torch, lens_shape):
    """query/key/value sizes 5/7/6 -> num_hiddens 12, 3 heads; valid_lens -> Mask.lengths."""
    source = d2l_torch.MultiHeadAttention(num_hiddens=12, num_heads=3, dropout=0.0)
    source(torch.randn(B, LQ, 5), torch.randn(B, LK, 7), torch.randn(B, LK, 6), None)  # sizes the LazyLinears
    source = source.double().eval()
    ours = mh.MultiHeadAttention.from_module(source)
    assert (ours.embed_dim, ours.kdim, ours.vdim, ours.num_heads, ours.head_dim) == (5, 7, 6, 3, 4)
    valid_lens = torch.tensor([1, LK, 3]) if lens_shape == "(B,)" else torch.randint(1, LK + 1, (B, LQ))
    assert_same_forward_backward(lambda q, k, v: source(q, k, v, valid_lens),
                                 lambda q, k, v: ours(q, k, v, mask=mh.Mask.lengths(valid_lens)),
                                 [randn64(B, LQ, 5), randn64(B, LK, 7), randn64(B, LK, 6)])


# --- labml-nn -------------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mask_shape", [(LQ, LK, B), (1, LK, B), (LQ, LK, 1), (1, LK, 1), None])
def test_labml_multihead_attention_converts_under_its_mask(labml_mha, bias, mask_shape):
    """heads 4, d_model 16, seq-first; mask (Lq, Lk, B), 0 = blocked, size-1 dims broadcast."""
    source = labml_mha.MultiHeadAttention(4, 16, dropout_prob=0.0, bias=bias).double().eval()
    ours = mh.MultiHeadAttention.from_module(source)
    assert ours.batch_first is False and ours.v_proj.bias is not None  # value always has a bias
    keep, ours_mask = None, None
    if mask_shape is not None:
        keep = torch.rand(mask_shape) < 0.6
        keep[:, 0] = True  # every query keeps at least one key
        ours_mask = mh.Mask.keep(keep.permute(2, 0, 1)[:, None])  # (Lq, Lk, B) -> (B, 1, Lq, Lk)
    assert_same_forward_backward(lambda q, k, v: source(query=q, key=k, value=v, mask=keep),
                                 lambda q, k, v: ours(q, k, v, mask=ours_mask),
                                 [randn64(LQ, B, 16), randn64(LK, B, 16), randn64(LK, B, 16)])


# --- all-MiniLM-L6-v2 -----------------------------------------------------------------------------

SENTENCES = [
    "Multi-head attention lets every token look at every other token.",
    "The cat sat on the mat.",
    "Padding must not change the result.",
    "注意力",
]


def _capture_attention_io(model, inputs):
    """Run `model` and record, per layer, the attention's input hidden states and output.dense's output."""
    records = [{} for _ in model.encoder.layer]
    handles = []
    for record, layer in zip(records, model.encoder.layer):
        def save_input(module, args, kwargs, record=record):
            record["x"] = args[0] if args else kwargs["hidden_states"]

        def save_output(module, args, output, record=record):
            record["y"] = output

        handles.append(layer.attention.register_forward_pre_hook(save_input, with_kwargs=True))
        handles.append(layer.attention.output.dense.register_forward_hook(save_output))
    try:
        with torch.no_grad():
            model(**inputs)
    finally:
        for handle in handles:
            handle.remove()
    return records


def test_every_minilm_layer_reproduces_hf_attention_on_padded_sentences(minilm):
    """Each layer's BertAttention -> from_module; its output equals HF's output.dense on the same input."""
    tokenizer, model = minilm
    model = copy.deepcopy(model).double()
    inputs = tokenizer(SENTENCES, padding=True, return_tensors="pt")
    assert not inputs["attention_mask"].all(), "the batch should contain padding"
    mask = mh.Mask.key_padding(~inputs["attention_mask"].bool())  # (B, Lk), True = padding
    records = _capture_attention_io(model, inputs)
    assert len(records) == 6
    for index, (layer, record) in enumerate(zip(model.encoder.layer, records)):
        ours = mh.MultiHeadAttention.from_module(layer.attention)
        assert (ours.num_heads, ours.head_dim, ours.training) == (12, 32, False)
        with torch.no_grad():
            got = ours(record["x"], mask=mask)
        torch.testing.assert_close(got, record["y"], atol=1e-10, rtol=1e-10, msg=lambda m: f"layer {index}: {m}")
