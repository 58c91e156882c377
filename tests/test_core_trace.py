"""mh.trace(): which backend ran for every attention call inside a model, and why."""
from __future__ import annotations

import torch

import multihead as mh
from multihead import capture


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = mh.MultiHeadAttention(32, 4)
        self.second = mh.MultiHeadAttention(32, 4)

    def forward(self, x):
        return self.second(self.first(x, causal=True), mask=mh.Mask.lengths(torch.tensor([3, 5])))


def test_trace_names_each_layer_its_backend_and_dispatchs_reason():
    model, x = TwoLayers().eval(), torch.randn(2, 5, 32)
    with mh.trace() as t:
        y = model(x)
    assert torch.equal(y, model(x))  # the calls themselves are unchanged
    assert [r.layer for r in t] == ["first", "second"] and len(t) == 2
    for r in t:
        q = torch.randn(2, 4, 5, 8)
        expected = mh.dispatch(q, q, q, mh.Mask.causal() if r.layer == "first" else mh.Mask.lengths(torch.tensor([3, 5])))
        assert r.backend == expected.backend and r.reason == expected.detail and r.dims == (2, 4, 5, 5)
        assert set(r.decision.reasons) == set(mh.dispatch(q, q, q).reasons) | {mh.dispatch(q, q, q).backend} - {r.backend}
    table = str(t)
    assert "first" in table and "second" in table and r.backend in table and "2 attention calls" in table


def test_a_standalone_module_is_named_by_its_class_and_bare_calls_have_no_layer():
    attn, x = mh.MultiHeadAttention(16, 2), torch.randn(1, 70, 16)
    with torch.no_grad(), mh.trace() as t:
        attn(x[:, :1], x, x)  # one query row over 70 keys: a decode step
        mh.attention(*(torch.randn(1, 2, 3, 8) for _ in range(3)))
    assert [(r.layer, r.backend) for r in t] == [("MultiHeadAttention", "decode"), ("", t[1].backend)]
    assert t.backends()["decode"] == 1 and "(top)" in str(t)


def test_off_nothing_is_recorded_and_no_hook_remains():
    model, x = TwoLayers(), torch.randn(2, 5, 32)
    with mh.trace() as t:
        pass
    model(x)
    assert len(t) == 0 and capture.ACTIVE == []
    assert not torch.nn.modules.module._global_forward_pre_hooks and not torch.nn.modules.module._global_forward_hooks


def test_trace_and_capture_together_each_get_every_call():
    model, x = TwoLayers(), torch.randn(2, 5, 32)
    with mh.trace() as t, mh.capture_attention(model) as record:
        model(x)
    assert len(t) == len(record) == 2 and [c.module for c in record] == [r.layer for r in t]
