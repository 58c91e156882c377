"""torch's two masks (attn_mask, key_padding_mask) as one multihead Mask, extra keys included.

torch's conventions: in a bool mask True means *blocked*, a float mask is added to the scores;
attn_mask is (L, S), or (B*H, L, S) ((H, L, S) unbatched); key_padding_mask is (B, S) ((S,) unbatched).
add_bias_kv and add_zero_attn append keys after the S real ones; torch extends both masks by
columns that block nothing (False / 0.0), so every query sees the extra keys.
"""
from __future__ import annotations

import torch
from torch import Tensor

from multihead.compat.checks import CallShape
from multihead.masks import Mask

__all__ = ["torch_masks_to_mask"]


def torch_masks_to_mask(attn_mask: Tensor | None, key_padding_mask: Tensor | None, call: CallShape, H: int,
                        extra_keys: int) -> Mask | None:
    """One Mask over (B, H, L, S + extra_keys), or None when nothing is masked."""
    B, L, S = call.B, call.L, call.S
    parts = []
    if attn_mask is not None:
        if call.drop_attn_mask:
            parts.append(Mask.causal())  # torch trusts the hint: its own top-left causal mask over every key
        else:
            attn_mask = _extend(attn_mask, extra_keys)
            if attn_mask.dim() == 3:
                attn_mask = attn_mask.view(B, H, L, S + extra_keys)
            parts.append(Mask.block(attn_mask) if attn_mask.dtype == torch.bool else Mask.additive(attn_mask))
    if key_padding_mask is not None:
        pad = _extend(key_padding_mask.view(B, S), extra_keys)  # (B, S + extra_keys)
        parts.append(Mask.key_padding(pad) if pad.dtype == torch.bool else Mask.additive(pad[:, None, None, :]))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else parts[0] & parts[1]


def _extend(mask: Tensor, extra_keys: int) -> Tensor:
    """`mask` (..., S) with `extra_keys` columns that block nothing appended: (..., S + extra_keys)."""
    if not extra_keys:
        return mask
    return torch.cat([mask, mask.new_zeros(*mask.shape[:-1], extra_keys)], dim=-1)
