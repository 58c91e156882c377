"""QueryTemperature: queries scaled up with their position, so attention stays sharp over long contexts.

Llama 4's layers without RoPE ("NoPE") multiply each query at absolute position p by

    s(p) = attn_scale · ln(1 + floor((p + 1) / floor_scale)) + 1        (1 for p + 1 < floor_scale)

computed in float32. Scores q·k grow by s(p) for the whole query row, so the softmax over many keys
does not flatten out as the context grows (Nakanishi, "Scalable-Softmax", 2025).
"""
from __future__ import annotations

import math

import torch
from torch import nn

from multihead.errors import AttentionError, check_number


class QueryTemperature(nn.Module):
    """q (B, H, L, D) at positions (L,) or (B, L) -> q · s(position); no parameters (see the module docstring)."""

    def __init__(self, floor_scale: float, attn_scale: float) -> None:
        super().__init__()
        check_number(floor_scale, "floor_scale", "a positive finite number", lambda x: 0 < x < math.inf)
        check_number(attn_scale, "attn_scale", "a finite number", math.isfinite)
        self.floor_scale, self.attn_scale = float(floor_scale), float(attn_scale)

    def factor(self, positions: torch.Tensor) -> torch.Tensor:
        """s(p) in float32, shaped like `positions`."""
        return torch.log1p(torch.floor((positions.to(torch.float32) + 1.0) / self.floor_scale)) * self.attn_scale + 1.0

    def forward(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if positions.dim() not in (1, 2) or positions.shape[-1] != q.shape[2]:
            raise AttentionError(f"QueryTemperature expects positions (L,) or (B, L) with L={q.shape[2]}; "
                                 f"got shape {tuple(positions.shape)}.")
        scale = self.factor(positions)  # (L,) or (B, L)
        scale = scale.view(1, 1, -1, 1) if scale.dim() == 1 else scale[:, None, :, None]  # (B|1, 1, L, 1)
        return (q * scale).to(q.dtype)

    def extra_repr(self) -> str:
        return f"floor_scale={self.floor_scale}, attn_scale={self.attn_scale}"
