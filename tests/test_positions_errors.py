"""Bad input to RoPE and apply_rotary raises AttentionError saying what was expected and what came,
and a failed call changes nothing."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.positions import apply_rotary

DYNAMIC = {"rope_type": "dynamic", "factor": 2.0}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


@pytest.mark.parametrize("kwargs, message", [
    (dict(head_dim=7), r"head_dim must be an even integer >= 2; got 7"),
    (dict(head_dim=True), r"head_dim must be an even integer >= 2; got True"),
    (dict(head_dim=8.0), r"head_dim must be an even integer >= 2; got 8\.0"),
    (dict(head_dim=8, rotary_dim=3), r"rotary_dim must be an even integer >= 2; got 3"),
    (dict(head_dim=8, rotary_dim=10), r"rotary_dim must be <= head_dim=8; got 10"),
    (dict(head_dim=8, base=1.0), r"base must be a finite number > 1; got 1\.0"),
    (dict(head_dim=8, base=float("inf")), r"base must be a finite number > 1; got inf"),
    (dict(head_dim=8, interleaved="yes"), r"interleaved must be True or False; got 'yes'"),
    (dict(head_dim=8, dtype=torch.int32), r"dtype must be a floating dtype or None; got torch\.int32"),
    (dict(head_dim=8, max_position=0), r"max_position must be a positive integer or None; got 0"),
    (dict(head_dim=8, scaling="linear"), r"expects a dict like HF's rope_scaling, or None; got str"),
    (dict(head_dim=8, scaling={"rope_type": "ntk-by-parts", "factor": 2.0}),
     r"kind must be one of \['default', 'dynamic', 'linear', 'llama3', 'longrope', 'yarn'\]; got 'ntk-by-parts'"),
    (dict(head_dim=8, scaling={"rope_type": "linear"}), r"'linear' expects keys \['factor'\].*missing \['factor'\]"),
    (dict(head_dim=8, scaling={"rope_type": "linear", "factr": 2}), r"unknown \['factr'\]"),
    (dict(head_dim=8, scaling={"rope_type": "linear", "type": "dynamic", "factor": 2}),
     r"'rope_type' and 'type' disagreeing; got \['dynamic', 'linear'\]"),
    (dict(head_dim=8, scaling={"rope_type": "linear", "factor": -2}),
     r"'factor' must be a positive finite number; got -2"),
    (dict(head_dim=8, scaling=DYNAMIC), r"needs the original context length.*got neither"),
    (dict(head_dim=8, scaling=LLAMA3), r"needs the original context length.*got neither"),
    (dict(head_dim=8, scaling={**LLAMA3, "original_max_position_embeddings": 2.5}),
     r"original context length must be a positive integer; got 2\.5"),
    (dict(head_dim=8, scaling={**LLAMA3, "low_freq_factor": 4.0}, max_position=64),
     r"expects low_freq_factor < high_freq_factor; got 4\.0 and 4\.0"),
    (dict(head_dim=8, base=500.0, scaling={"rope_theta": 10000.0}), r"rope_theta must equal base=500\.0; got 10000\.0"),
    (dict(head_dim=8, rotary_dim=4, scaling={"partial_rotary_factor": 0.25}),
     r"rotary_dim=4 disagrees with the scaling dict's partial_rotary_factor=0\.25 \(head_dim \* factor = 2\)"),
    (dict(head_dim=8, rotary_dim=2, scaling=DYNAMIC, max_position=16), r"expects rotary_dim > 2.*got 2"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(mh.AttentionError, match=message):
        mh.RoPE(**kwargs)


def qk(B=2, L=3, D=8):
    return torch.randn(B, 4, L, D), torch.randn(B, 2, L, D)


@pytest.mark.parametrize("make, message", [
    (lambda q, k: (q, k, torch.arange(3.0)), r"integer positions \(e\.g\. torch\.long\); got dtype torch\.float32"),
    (lambda q, k: (q, k, torch.ones(3, dtype=torch.bool)), r"integer positions .*got dtype torch\.bool"),
    (lambda q, k: (q, k, [0, 1, 2]), r"positions as an integer tensor; got list"),
    (lambda q, k: (q, k, torch.zeros(2, 3, 1, dtype=torch.long)), r"shaped \(L,\) or \(B, L\); got \(2, 3, 1\)"),
    (lambda q, k: (q, k, torch.arange(4)), r"positions shaped \(L,\) = \(3,\) or \(B, L\) = \(2, 3\).*got \(4,\)"),
    (lambda q, k: (q, k, torch.zeros(3, 3, dtype=torch.long)), r"\(B, L\) = \(2, 3\).*got \(3, 3\)"),
    (lambda q, k: (q, k, torch.arange(3, device="meta")), r"positions on q's device cpu; got meta"),
    (lambda q, k: (q[0], k, torch.arange(3)), r"q as a floating tensor \(B, H, L, D\); got torch\.float32 \(4, 3, 8\)"),
    (lambda q, k: (q, k.long(), torch.arange(3)), r"k as a floating tensor \(B, Hkv, L, D\); got torch\.int64"),
    (lambda q, k: (q[..., :6], k, torch.arange(3)), r"expects q's last dim D=8; got q \(2, 4, 3, 6\)"),
    (lambda q, k: (q, k[..., :6], torch.arange(3)), r"expects k's last dim D=8; got k \(2, 2, 3, 6\)"),
    (lambda q, k: (q, k[:1], torch.arange(3)), r"k \(B, Hkv, L, D\) with q's B and L.*k \(1, 2, 3, 8\)"),
    (lambda q, k: (q, k[:, :, :2], torch.arange(3)), r"q's B and L.*k \(2, 2, 2, 8\)"),
])
def test_bad_calls_are_refused_and_change_no_state(make, message):
    rope = mh.RoPE(8, scaling=DYNAMIC, max_position=4)
    rope(*qk(L=3), torch.arange(10, 13))  # grows to 13
    with pytest.raises(mh.AttentionError, match=message):
        rope(*make(*qk(L=3)))
    assert int(rope.seen_length) == 13


def test_module_and_inputs_on_different_devices_are_refused():
    rope = mh.RoPE(8).to("meta")
    with pytest.raises(mh.AttentionError, match=r"buffers are on meta but the inputs are on cpu"):
        rope(*qk(), torch.arange(3))
    with pytest.raises(mh.AttentionError, match=r"buffers are on meta but the inputs are on cpu"):
        rope.cos_sin(torch.arange(3))


def test_cos_sin_refuses_bad_positions_and_dtypes():
    rope = mh.RoPE(8)
    with pytest.raises(mh.AttentionError, match=r"integer positions"):
        rope.cos_sin(torch.arange(3.0))
    with pytest.raises(mh.AttentionError, match=r"floating dtype; got torch\.int64"):
        rope.cos_sin(torch.arange(3), torch.int64)


@pytest.mark.parametrize("x, cos, sin, message", [
    (torch.randn(2, 3, 8), torch.ones(1, 3, 8), torch.ones(1, 3, 8), r"x shaped \(B, H, L, D\); got \(2, 3, 8\)"),
    (torch.randn(2, 1, 3, 8), torch.ones(1, 3, 8), torch.ones(1, 3, 6), r"cos and sin of one shape"),
    (torch.randn(2, 1, 3, 8), torch.ones(3, 3, 8), torch.ones(3, 3, 8),
     r"\(B or 1, L, R\) = \(2 or 1, 3, R\) for x \(2, 1, 3, 8\); got \(3, 3, 8\)"),
    (torch.randn(2, 1, 3, 8), torch.ones(1, 3, 10), torch.ones(1, 3, 10), r"0 < R <= D=8; got R=10"),
    (torch.randn(2, 1, 3, 8), torch.ones(1, 3, 5), torch.ones(1, 3, 5), r"even rotary dim.*got R=5"),
    (torch.randn(2, 1, 3, 8), torch.ones(1, 3, 8, dtype=torch.long), torch.ones(1, 3, 8),
     r"cos as a floating tensor; got dtype torch\.int64"),
    (torch.randn(2, 1, 3, 8), torch.ones(1, 3, 8, device="meta"), torch.ones(1, 3, 8, device="meta"),
     r"cos/sin on x's device cpu; got meta and meta"),
])
def test_apply_rotary_refuses_mismatched_inputs(x, cos, sin, message):
    with pytest.raises(mh.AttentionError, match=message):
        apply_rotary(x, cos, sin)


def test_errors_are_value_errors():
    with pytest.raises(ValueError):
        mh.RoPE(3)
