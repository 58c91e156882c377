"""Sparse attention by fancy indexing: the keys of each query are read straight from its index list, the
free slots (-1) included."""

import torch


def sparse_attention(q, k, v, idx):
    B, H, Lq, D = q.shape
    batch = torch.arange(B)[:, None, None]
    k_sel = k.transpose(1, 2)[batch, idx]                 # (B, Lq, K, H, D)
    v_sel = v.transpose(1, 2)[batch, idx]
    scores = torch.einsum("bhqd,bqkhd->bhqk", q, k_sel) * D ** -0.5
    weights = scores.softmax(dim=-1)
    return torch.einsum("bhqk,bqkhd->bhqd", weights, v_sel)
