"""On a CUDA device: the same answers as on the CPU, and no host syncs on the hot path.

Skipped where there is no GPU (CI has none); run on a GPU machine with `pytest tests/test_gpu.py`.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from tests.helpers import reference_attention

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

B, H, Hkv, L, D = 2, 8, 2, 64, 64


def _qkv(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, h, L, D, generator=g).to("cuda", dtype) for h in (H, Hkv, Hkv)]


def _masks():
    lens = torch.tensor([64, 23], device="cuda")
    pad = torch.arange(L, device="cuda")[None] >= lens[:, None]
    return {
        "causal": mh.Mask.causal(),
        "key-padding": mh.Mask.key_padding(pad),
        "lengths&causal": mh.Mask.lengths(lens) & mh.Mask.causal(),
        "window&causal": mh.Mask.window(16) & mh.Mask.causal(),
        "alibi&causal": mh.Mask.alibi(mh.alibi_slopes(H).cuda()) & mh.Mask.causal(),
    }


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["causal", "key-padding", "lengths&causal", "window&causal", "alibi&causal"])
def test_every_backend_matches_float64_on_the_gpu(name, dtype):
    mask = _masks()[name]
    q, k, v = _qkv(dtype)
    keep, bias = mask.materialize(B, H, L, L, device="cuda", dtype=torch.float64)
    ref = reference_attention(q.double(), k.double(), v.double(), keep=keep, bias=bias)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for backend in ("auto", "sdpa", "math"):
        out = mh.attention(q, k, v, mask, backend=backend)
        assert (out.double() - ref).abs().max().item() <= tol, backend


@pytest.mark.parametrize("name", ["causal", "key-padding", "lengths&causal", "window&causal"])
def test_the_hot_path_never_syncs_with_the_host(name):
    mask = _masks()[name]
    q, k, v = _qkv(torch.bfloat16)
    mh.attention(q, k, v, mask)  # warm up (first calls may load kernels)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        mh.attention(q, k, v, mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_decoding_on_the_gpu_equals_the_full_forward_and_never_syncs():
    torch.manual_seed(0)
    m = mh.MultiHeadAttention(256, 8, num_kv_heads=2, causal=True, rope=mh.RoPE(32), window=16).cuda().eval()
    x = torch.randn(2, 40, 256, device="cuda")
    cache = m.new_cache(2, 48)
    with torch.no_grad():
        outs = [m(x[:, :8], cache=cache)]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            outs += [m(x[:, t:t + 1], cache=cache) for t in range(8, 40)]
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.testing.assert_close(torch.cat(outs, 1), m(x), atol=2e-5, rtol=2e-5)


def test_fully_masked_rows_are_zero_with_zero_grad_on_the_gpu():
    q, k, v = (t.requires_grad_() for t in _qkv(torch.bfloat16))
    out = mh.attention(q, k, v, mh.Mask.lengths(torch.tensor([0, 10], device="cuda")))
    assert not out[0].any()
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    assert all(not g[0].any() for g in grads)
