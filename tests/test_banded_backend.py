"""The banded backend: blocks of queries attend only to the keys their mask lets them see."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends.banded import MIN_KEYS

PAD = torch.rand(2, 300, generator=torch.Generator().manual_seed(0)) > 0.8


def _qkv(Lq=300, Lk=300, H=4, Hkv=2, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, H, Lq, D, generator=g), torch.randn(2, Hkv, Lk, D, generator=g),
            torch.randn(2, Hkv, Lk, D, generator=g))


MASKS = {
    "window&causal": (mh.Mask.window(40) & mh.Mask.causal(), 300),
    "window&causal&padding": (mh.Mask.window(40) & mh.Mask.causal() & mh.Mask.key_padding(PAD), 300),
    "bottom-right window, Lq < Lk": (mh.Mask.window(30, "bottom_right") & mh.Mask.causal("bottom_right"), 120),
    "window&alibi": (mh.Mask.window(50) & mh.Mask.causal() & mh.Mask.alibi(torch.tensor([0.5, 0.1, 0.05, 0.01])), 300),
    "window only (looks ahead)": (mh.Mask.window(25), 300),
}


@pytest.mark.parametrize("name", sorted(MASKS))
def test_blocks_equal_the_dense_path_values_and_grads(name):
    mask, Lq = MASKS[name]
    q, k, v = _qkv(Lq=Lq)
    outs, grads = [], []
    for backend in ("banded", "math"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        out = mh.attention(*leaves, mask, backend=backend)
        outs.append(out)
        grads.append(torch.autograd.grad(out.sum(), leaves))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
    for g_banded, g_math in zip(*grads):
        torch.testing.assert_close(g_banded, g_math, atol=1e-4, rtol=1e-4)


def test_auto_picks_blocks_only_when_they_skip_most_of_the_grid():
    q, k, v = _qkv(Lq=MIN_KEYS, Lk=MIN_KEYS, H=2, Hkv=2, D=8)
    window = mh.dispatch(q, k, v, mh.Mask.window(128) & mh.Mask.causal())
    assert window.backend == "banded" and "skipped" in window.detail
    causal = mh.dispatch(q, k, v, mh.Mask.window(MIN_KEYS) & mh.Mask.causal())  # a window as wide as the input
    assert causal.backend == "sdpa" and causal.codes["banded"] == "banded.too-little-skipped"
    short = mh.dispatch(*_qkv(), mh.Mask.window(8) & mh.Mask.causal())
    assert short.codes["banded"] == "banded.too-few-keys"


def test_spans_that_differ_per_sequence_are_left_to_other_backends():
    q, k, v = _qkv(Lq=20, Lk=300)
    mask = mh.Mask.lengths(torch.tensor([300, 100])) & mh.Mask.causal("bottom_right") & mh.Mask.window(10, "bottom_right")
    with pytest.raises(mh.AttentionError, match="differ per sequence"):
        mh.attention(q, k, v, mask, backend="banded")


def test_blocks_compile_without_graph_breaks():
    q, k, v = _qkv()
    mask = mh.Mask.window(40) & mh.Mask.causal()
    f = torch.compile(lambda q, k, v, m: mh.attention(q, k, v, m, backend="banded"), backend="eager", fullgraph=True)
    torch.testing.assert_close(f(q, k, v, mask), mh.attention(q, k, v, mask, backend="math"), atol=1e-5, rtol=1e-5)
