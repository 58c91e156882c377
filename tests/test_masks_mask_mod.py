"""Mask.mask_mod with Python's `and`/`or`/`not`: torch's bare "Boolean value of Tensor ... is ambiguous"
becomes an AttentionError that names the function and says to use `&`, `|`, `~`; it stays a RuntimeError,
the type torch raises, so code that caught torch's error still catches it."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.masks.mask_mod import MaskModTruthError


def causal_with_and(b, h, q_idx, kv_idx):
    return q_idx >= kv_idx and kv_idx >= 0


def not_the_future(b, h, q_idx, kv_idx):
    return not kv_idx > q_idx


def causal_with_amp(b, h, q_idx, kv_idx):
    return (q_idx >= kv_idx) & ~(kv_idx < 0)


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, 5, 8, generator=g) for _ in range(3)]


def test_torch_itself_raises_a_runtime_error_for_the_truth_of_a_tensor():
    with pytest.raises(RuntimeError, match="Boolean value of Tensor"):
        causal_with_and(None, None, torch.arange(3)[:, None], torch.arange(3))


@pytest.mark.parametrize("fn", [causal_with_and, not_the_future])
@pytest.mark.parametrize("backend", ["auto", "math"])
def test_python_booleans_in_a_mask_mod_name_the_function_and_the_operators(fn, backend):
    q, k, v = qkv()
    with pytest.raises(MaskModTruthError) as caught:
        mh.attention(q, k, v, mask=mh.Mask.mask_mod(fn), backend=backend)
    error = caught.value
    assert isinstance(error, mh.AttentionError) and isinstance(error, ValueError) and isinstance(error, RuntimeError)
    message = str(error)
    assert repr(fn.__name__) in message and "`&`, `|` and `~`" in message and "Boolean value of Tensor" in message
    assert isinstance(error.__cause__, RuntimeError) and not isinstance(error.__cause__, mh.AttentionError)


def test_the_same_mask_written_with_tensor_operators_runs_and_other_errors_pass_through():
    q, k, v = qkv()
    out = mh.attention(q, k, v, mask=mh.Mask.mask_mod(causal_with_amp))
    torch.testing.assert_close(out, mh.attention(q, k, v, causal=True))

    def broken(b, h, q_idx, kv_idx):
        raise RuntimeError("something else went wrong")

    with pytest.raises(RuntimeError, match="something else went wrong") as caught:
        mh.attention(q, k, v, mask=mh.Mask.mask_mod(broken))
    assert not isinstance(caught.value, mh.AttentionError)
