"""Scaled dot-product attention as a plain function, with the conventions of
torch.nn.functional.scaled_dot_product_attention: a boolean mask where True means "may attend"."""
from typing import Optional

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Optional[torch.Tensor] = None) -> torch.Tensor:
    """q (B, H, Lq, D), k and v (B, H, Lk, D) -> (B, H, Lq, D).

    mask: bool, broadcastable to (B, H, Lq, Lk); True = this query may attend to this key.
    """
    scale = q.size(-1) ** -0.5
    scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v
