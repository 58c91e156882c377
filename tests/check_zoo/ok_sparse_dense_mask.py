"""Sparse attention written the simple way: scatter each query's list into a dense keep mask, then ordinary
masked attention. The free slots (-1) are sent to an extra column that is cut off afterwards."""

import torch
import torch.nn.functional as F


def attend_selected(query, key, value, topk_indices):
    B, Lq, _ = topk_indices.shape
    Lk = key.shape[-2]
    slots = torch.where(topk_indices >= 0, topk_indices, Lk)           # -1 -> the spare column Lk
    keep = torch.zeros(B, Lq, Lk + 1, dtype=torch.bool)
    keep.scatter_(-1, slots, True)
    keep = keep[..., :Lk]                                              # (B, Lq, Lk)
    return F.scaled_dot_product_attention(query, key, value, attn_mask=keep[:, None])


def pick_keys(scores):
    """The 3 best keys of every query, best first."""
    order = torch.argsort(scores, dim=-1, descending=True)
    return order[..., :3]
