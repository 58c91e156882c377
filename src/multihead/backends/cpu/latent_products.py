"""The absorbed MLA step's two per-head products, with a C++ kernel for a decode step's few rows.

    fold(q_nope, w_uk)  q_nope (B, H, L, Dn) @ W_UK (H, Dn, C)     -> (B, H, L, C): W_UK folded into the query
    unfold(o, w_uv)     o (B, H, L, C) @ W_UV (H, Dv, C)^T          -> (B, H, L, Dv): W_UV applied to the output

For bfloat16 weights on the CPU, with at most MAX_ROWS rows (B * L) and no gradient wanted, the C++ kernel
(latent_products.h, built with the decode kernel) reads each weight once, in order, and sums in float32:
on this CPU torch's bfloat16 bmm runs these matrix-vector shapes at a third of that rate (cold caches,
H=16, Dn=Dv=128, C=512: 215 and 360 µs against 90 and 67 µs). Everywhere else torch's matmul runs them.
Both forms round once to the input dtype, as torch's bfloat16 matmul does.
"""
from __future__ import annotations

import torch

from multihead.backends.cpu import ops
from multihead.backends.cpu.build import kernel, loaded

MAX_ROWS = 8  # more rows than this: a prefill, where torch's matrix products are the faster form


def _kernel_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether the C++ kernel takes this product (see the module docstring); reads shapes and flags only."""
    B, H, L, _ = x.shape
    if w.dtype != torch.bfloat16 or w.device.type != "cpu" or not w.is_contiguous() or B * L > MAX_ROWS:
        return False
    if torch.is_grad_enabled() and (x.requires_grad or w.requires_grad):
        return False  # the kernel has no backward
    module = loaded() if torch.compiler.is_compiling() else kernel()
    return module is not None and hasattr(module, "latent_product")


def _product(w: torch.Tensor, x: torch.Tensor, fold: bool) -> torch.Tensor:
    """x (B, H, L, K) through the kernel -> (B, H, L, N) in x's dtype (the custom op under torch.compile)."""
    B, H, L, K = x.shape
    rows = x.transpose(0, 1).reshape(H, B * L, K).float().contiguous()  # (H, B * L, K): the rows per head
    y = ops.call("latent_product", w, rows, fold)
    return y.view(H, B, L, y.shape[-1]).transpose(0, 1).to(x.dtype)


def fold(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    """q_nope (B, H, L, Dn) @ w_uk (H, Dn, C) -> (B, H, L, C)."""
    if _kernel_runs(q_nope, w_uk):
        return _product(w_uk, q_nope, True)
    return q_nope @ w_uk


def unfold(o: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    """o (B, H, L, C) @ w_uv (H, Dv, C)^T -> (B, H, L, Dv)."""
    if _kernel_runs(o, w_uv):
        return _product(w_uv, o, False)
    # W_UV @ o^T: this order runs bfloat16 on the CPU about 6x faster than o @ W_UV^T
    return (w_uv @ o.transpose(-1, -2)).transpose(-1, -2)
