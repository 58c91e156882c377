"""ALiBi slopes (Press et al., "Train Short, Test Long", 2022): one linear distance penalty per head.

ALiBi adds no position to q or k. Instead head h subtracts  slope[h] · (i - j)  from the score of query i
and key j, so far keys fade, each head at its own rate. For H heads, H a power of two, the slopes are the
geometric sequence

    slope[h] = 2 ** (-8 (h + 1) / H)        h = 0 .. H - 1      (H = 8: 1/2, 1/4, ..., 1/256)

For other H (BLOOM's 112 heads, say) the paper takes the sequence for the power of two just below H, then
fills the remaining heads with every other slope of the sequence for twice that power, the slopes that
fall between the ones already taken:

    H = 12:  the 8 slopes for H = 8  +  slopes 0, 2, 4, 6 of the sequence for 16
"""
from __future__ import annotations

import torch

from multihead.errors import AttentionError


def alibi_slopes(num_heads: int, *, device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The ALiBi slope of every head, (H,), largest first; for any head count, as in the paper and BLOOM."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise AttentionError(f"alibi_slopes expects a positive integer head count; got {num_heads!r}.")
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise AttentionError(f"alibi_slopes expects a floating dtype; got {dtype!r}.")
    power = 1 << (num_heads.bit_length() - 1)  # the largest power of two <= H
    slopes = _geometric(power) + _geometric(2 * power)[0::2][: num_heads - power]
    return torch.tensor(slopes, dtype=torch.float64, device=device).to(dtype)  # exact in float64, then cast


def _geometric(count: int) -> list[float]:
    """2 ** (-8 (h + 1) / count) for h = 0 .. count - 1: the slopes of `count` heads, count a power of two."""
    return [2.0 ** (-8.0 * (h + 1) / count) for h in range(count)]
