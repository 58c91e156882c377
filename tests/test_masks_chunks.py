"""Mask.chunks: block-diagonal attention by position chunk (Llama 4), on every backend and precision."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends.banded import MIN_KEYS

BACKENDS = ("auto", "math", "sdpa", "banded", "flex")


def reference(q, k, v, size: int, offset: int = 0) -> torch.Tensor:
    """Float64 attention where query i (at position i + offset) keeps keys j <= i + offset of its chunk."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    i = torch.arange(q.shape[2])[:, None] + offset
    j = torch.arange(k.shape[2])[None, :]
    keep = (j <= i) & (j // size == i // size)
    scores = (q64 @ k64.transpose(-2, -1)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v64


def qkv(Lq: int, Lk: int, dtype=torch.float32, H: int = 2, D: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(1, H, L, D, generator=g).to(dtype) for L in (Lq, Lk, Lk))


def test_the_dense_form_is_the_chunk_rule():
    keep, bias = mh.Mask.chunks(3).materialize(1, 1, 7, 7)
    expected = torch.tensor([[i // 3 == j // 3 for j in range(7)] for i in range(7)])
    assert bias is None and torch.equal(keep.reshape(7, 7), expected)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_every_backend_matches_float64_at_the_banded_length(backend, dtype):
    L, size = MIN_KEYS + 64, 512  # the banded backend engages from MIN_KEYS keys
    q, k, v = qkv(L, L, dtype)
    expected = reference(q, k, v, size)
    mask = mh.Mask.chunks(size) & mh.Mask.causal()
    with torch.no_grad():
        got = mh.attention(q, k, v, mask, backend=backend)
        same_dtype_math = mh.attention(q, k, v, mask, backend="math")
    drift = (same_dtype_math.double() - expected).abs().max().item()
    assert (got.double() - expected).abs().max().item() <= 2 * drift + 1e-6


def test_auto_runs_the_banded_blocks_when_chunks_skip_most_keys():
    q, k, v = qkv(MIN_KEYS, MIN_KEYS)
    assert mh.dispatch(q, k, v, mh.Mask.chunks(256) & mh.Mask.causal()).backend == "banded"


@pytest.mark.parametrize("mode", ["grad", "no_grad", "inference_mode"])
def test_gradients_and_modes(mode):
    q, k, v = qkv(40, 40, torch.float64)
    mask = mh.Mask.chunks(8) & mh.Mask.causal()
    if mode == "grad":
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        grads = torch.autograd.grad(mh.attention(*leaves, mask).sum(), leaves)
        expected = torch.autograd.grad(reference(*leaves, 8).sum(), leaves)
        for got, want in zip(grads, expected):
            torch.testing.assert_close(got, want)
        return
    context = torch.no_grad() if mode == "no_grad" else torch.inference_mode()
    with context:
        torch.testing.assert_close(mh.attention(q, k, v, mask), reference(q, k, v, 8))


def test_bottom_right_chunks_follow_the_cache():
    """A decode step at position p sees only its own chunk's keys up to p."""
    q, k, v = qkv(3, 21, torch.float64)
    mask = mh.Mask.chunks(8, "bottom_right") & mh.Mask.causal("bottom_right")
    torch.testing.assert_close(mh.attention(q, k, v, mask), reference(q, k, v, 8, offset=18))


def test_compiles_once_across_lengths():
    torch._dynamo.reset()
    from torch._dynamo.testing import CompileCounter

    counter = CompileCounter()
    compiled = torch.compile(lambda q, k, v: mh.attention(q, k, v, mh.Mask.chunks(8) & mh.Mask.causal()),
                             backend=counter, fullgraph=True, dynamic=True)
    for L in (19, 33, 47):
        q, k, v = qkv(L, L)
        torch.testing.assert_close(compiled(q, k, v), reference(q, k, v, 8).float(), atol=1e-5, rtol=1e-5)
    assert counter.frame_count == 1


@pytest.mark.parametrize("size", [0, -3, 2.5, True])
def test_bad_sizes_are_refused(size):
    with pytest.raises(mh.AttentionError, match="positive int"):
        mh.Mask.chunks(size)
