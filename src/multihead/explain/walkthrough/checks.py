"""The numeric comparisons behind the walkthrough's checks: float64 differences, one tolerance rule."""
from __future__ import annotations

import torch

from multihead.explain.say import Say

RTOL = 1e-5  # float32 results of the same math in a different order differ by a few ulps


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference, computed in float64 (0.0 for empty tensors)."""
    if a.numel() == 0:
        return 0.0
    return (a.detach().double() - b.detach().double()).abs().max().item()


def tolerance(reference: torch.Tensor) -> float:
    """RTOL scaled by the reference's magnitude (at least RTOL)."""
    finite = reference.detach().double()
    finite = finite[torch.isfinite(finite)]
    return RTOL * max(1.0, finite.abs().max().item() if finite.numel() else 1.0)


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same shape and equal up to `tolerance(b)`."""
    return a.shape == b.shape and max_diff(a, b) <= tolerance(b)


def diff_text(a: torch.Tensor, b: torch.Tensor) -> str:
    """`max |diff| = 1.2e-07` for a check's detail line."""
    if a.shape != b.shape:
        return f"shapes {tuple(a.shape)} vs {tuple(b.shape)}"
    return f"max |diff| = {max_diff(a, b):.1e}"


def check_close(say: Say, key: str, got: torch.Tensor, want: torch.Tensor, **values) -> bool:
    """Tell claim `key` that `got` equals `want` (up to `tolerance(want)`), with the difference shown."""
    return say.check(key, close(got, want), diff_text(got, want), **values)


def head_columns_diff(heads: torch.Tensor, flat: torch.Tensor) -> float:
    """Largest difference between head h of heads (B, H, L, D) and columns h*D..(h+1)*D-1 of
    flat (B, L, H*D), over all heads: 0.0 when every head sits exactly in its own columns."""
    H, D = heads.shape[1], heads.shape[-1]
    return max(max_diff(heads[:, h], flat[..., h * D:(h + 1) * D]) for h in range(H))
