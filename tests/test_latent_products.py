"""latent_products: the absorbed MLA step's per-head products, C++ kernel and torch forms, against float64."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends.cpu import latent_products
from multihead.backends.cpu import build as decode_build

needs_kernel = pytest.mark.skipif(decode_build.kernel() is None, reason="the C++ kernel could not be built here")
SHAPES = [(1, 16, 1, 128, 512), (2, 3, 1, 5, 40), (1, 2, 3, 33, 17), (3, 4, 2, 64, 300)]  # (B, H, L, K, N)


def _drift(dtype_out, exact):
    """Twice torch's own error in this dtype plus float32 summation slack."""
    return 2 * (dtype_out.double() - exact).abs().max().item() + 1e-5


@needs_kernel
@pytest.mark.parametrize("B, H, L, K, N", SHAPES)
def test_the_kernel_products_match_float64_within_twice_torchs_bf16_error(B, H, L, K, N):
    g = torch.Generator().manual_seed(K * N)
    x = torch.randn(B, H, L, K, generator=g).bfloat16()
    w_fold = torch.randn(H, K, N, generator=g).bfloat16()
    w_unfold = torch.randn(H, N, K, generator=g).bfloat16()
    with torch.no_grad():
        assert latent_products._kernel_runs(x, w_fold)
        exact = x.double() @ w_fold.double()
        out = latent_products.fold(x, w_fold)
        assert out.dtype == torch.bfloat16 and out.shape == (B, H, L, N)
        assert (out.double() - exact).abs().max().item() <= _drift(x @ w_fold, exact)
        exact = x.double() @ w_unfold.double().transpose(-1, -2)
        out = latent_products.unfold(x, w_unfold)
        assert out.shape == (B, H, L, N)
        assert (out.double() - exact).abs().max().item() <= _drift(x @ w_unfold.transpose(-1, -2), exact)


@needs_kernel
def test_nan_stays_in_its_row_and_grad_mode_runs_torch():
    x = torch.randn(1, 4, 2, 64).bfloat16()
    x[0, 1, 0, 7] = float("nan")
    w = torch.randn(4, 64, 96).bfloat16()
    with torch.no_grad():
        out = latent_products.fold(x, w)
    assert out[0, 1, 0].isnan().all() and out[0, 1, 1].isfinite().all() and out[0, 0].isfinite().all()
    leaf = torch.randn(1, 4, 1, 64, dtype=torch.bfloat16, requires_grad=True)
    assert not latent_products._kernel_runs(leaf, w)  # the kernel has no backward: torch's matmul runs
    latent_products.fold(leaf, w).float().sum().backward()
    assert leaf.grad is not None
    assert not latent_products._kernel_runs(torch.randn(1, 4, 9, 64).bfloat16(), w)  # a prefill: torch's GEMM
    assert not latent_products._kernel_runs(x.float(), w.float())  # float32: torch's bmm is fine there


@needs_kernel
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode", "compiled"])
def test_a_bf16_mla_decode_step_through_the_kernel_matches_float64(mode):
    """The absorbed step (fold, decode kernel, unfold) in bf16 against the float64 naive computation."""
    torch.manual_seed(0)
    mla = mh.MultiHeadLatentAttention(64, 4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
                                      v_head_dim=16).eval()
    x = torch.randn(2, 70, 64)
    exact = mla.double()(x.double(), causal=True)[:, -1:]
    low = mla.to(torch.bfloat16)
    same = low(x.bfloat16(), causal=True, absorb=False)[:, -1:]  # the same-dtype drift
    context = {"no_grad": torch.no_grad, "inference_mode": torch.inference_mode, "compiled": torch.no_grad}[mode]
    step = torch.compile(low, dynamic=True) if mode == "compiled" else low
    with context():
        cache = low.new_cache(2, 80)
        low(x[:, :69].bfloat16(), cache=cache)
        out = step(x[:, 69:].bfloat16(), cache=cache)
    error = (out.double() - exact).abs().max().item()
    assert error <= 2 * (same.double() - exact).abs().max().item() + 1e-3
