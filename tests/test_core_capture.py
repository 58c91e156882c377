"""capture_attention: weights of every attention call inside a model, call sites unchanged."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import multihead as mh
from helpers import max_abs_diff


class TwoLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = mh.MultiHeadAttention(8, 2)
        self.second = mh.MultiHeadAttention(8, 4)

    def forward(self, x, mask=None):
        return self.second(self.first(x, mask=mask), causal=True)


class SdpaUser(nn.Module):
    """A model that calls torch's SDPA directly, as HF and nanoGPT do."""

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_records_every_call_with_module_names_and_shapes():
    model = TwoLayers()
    x = torch.randn(3, 5, 8)
    pad = mh.Mask.key_padding(torch.tensor([[0, 0, 0, 1, 1]] * 3).bool())
    with mh.capture_attention(model) as record:
        y = model(x, mask=pad)
    assert torch.equal(y, model(x, mask=pad))  # the call itself is unchanged
    assert [c.module for c in record] == ["first", "second"]
    assert record[0].weights.shape == (3, 2, 5, 5) and record[1].weights.shape == (3, 4, 5, 5)
    assert torch.allclose(record[0].weights.sum(-1), torch.ones(3, 2, 5))
    assert (record[0].weights[..., 3:] == 0).all()  # padding keys get no weight
    assert (record[1].weights.triu(1) == 0).all()  # causal
    assert len(record["second"]) == 1 and len(record.weights) == 2


def test_nothing_is_recorded_outside_the_block_or_the_model():
    model, other = TwoLayers(), mh.MultiHeadAttention(8, 2)
    x = torch.randn(1, 4, 8)
    with mh.capture_attention(model) as record:
        other(x)  # not inside `model`
    model(x)  # after the block
    assert len(record) == 0
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


def test_records_direct_sdpa_calls_with_their_weights():
    q, k, v = (torch.randn(2, 3, 4, 8) for _ in range(3))
    model = SdpaUser()
    with mh.capture_attention(model) as record:
        out = model(q, k, v)
    w = record[0].weights
    assert max_abs_diff(w.to(v.dtype) @ v, out) < 1e-5


def test_records_torch_multihead_attention_and_returns_what_was_asked():
    model = nn.MultiheadAttention(8, 2, batch_first=True)
    x = torch.randn(2, 4, 8)
    expected_out, expected_avg = model(x, x, x)
    with mh.capture_attention(model) as record:
        out, avg = model(x, x, x)
        out2, none = model(x, x, x, need_weights=False)
    assert torch.allclose(out, expected_out) and torch.allclose(avg, expected_avg) and none is None
    assert record[0].weights.shape == (2, 2, 4, 4)
    assert torch.allclose(record[0].weights.mean(1), expected_avg)


def test_capture_without_model_records_everywhere():
    q, k, v = (torch.randn(1, 2, 3, 4) for _ in range(3))
    with mh.capture_attention() as record:
        mh.attention(q, k, v)
    assert len(record) == 1 and record[0].module == ""
