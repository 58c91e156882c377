"""Token-sparse attention as DeepSeek V3.2's indexer feeds it: each query attends only to the keys its list
names. q (B, H, Lq, D), k and v (B, H, Lk, D), indices (B, Lq, K) with -1 in the free slots."""

import math

import torch


def sparse_attention(q, k, v, indices):
    B, H, Lq, D = q.shape
    K = indices.shape[-1]
    free = indices < 0                                            # (B, Lq, K): slots that name no key
    safe = indices.clamp(min=0)                                   # any real key; its score is masked below
    index = safe[:, None, :, :, None].expand(B, H, Lq, K, D)
    k_sel = torch.gather(k.unsqueeze(2).expand(B, H, Lq, -1, D), 3, index)   # (B, H, Lq, K, D)
    v_sel = torch.gather(v.unsqueeze(2).expand(B, H, Lq, -1, D), 3, index)
    scores = torch.einsum("bhqd,bhqkd->bhqk", q, k_sel) / math.sqrt(D)
    scores = scores.masked_fill(free[:, None], float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    return torch.einsum("bhqk,bhqkd->bhqd", weights, v_sel)


def select_top_k(index_scores, top_k):
    """index_scores (B, Lq, Lk), -inf where a query may not look -> the top_k best keys of each query,
    (B, Lq, top_k), -1 in the slots a query has no key for."""
    values, picked = index_scores.topk(top_k, dim=-1)
    return torch.where(values == float("-inf"), -1, picked)
