"""Course-assignment style: causal multi-head self-attention as a function that is handed its weights.
Following the assignment's Linear convention, every weight is (d_out, d_in) and a projection is
x @ W.T. Both helpers work on any leading batch dimensions."""
import math

import torch
from torch import Tensor


def softmax(x: Tensor, dim: int) -> Tensor:
    x = x - x.amax(dim=dim, keepdim=True)  # subtract the max for numerical stability
    e = torch.exp(x)
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(Q: Tensor, K: Tensor, V: Tensor, mask: Tensor | None = None) -> Tensor:
    """Q (..., queries, d_k), K (..., keys, d_k), V (..., keys, d_v); mask (queries, keys), True = attend."""
    d_k = Q.shape[-1]
    scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1) @ V


def multihead_self_attention(d_model: int, num_heads: int, q_proj_weight: Tensor, k_proj_weight: Tensor,
                             v_proj_weight: Tensor, o_proj_weight: Tensor, in_features: Tensor) -> Tensor:
    """in_features (..., seq_len, d_model) -> (..., seq_len, d_model), causal."""
    *batch, seq_len, _ = in_features.shape
    d_head = d_model // num_heads
    q = in_features @ q_proj_weight.T  # (..., seq_len, d_model)
    k = in_features @ k_proj_weight.T
    v = in_features @ v_proj_weight.T

    def split(t: Tensor) -> Tensor:  # (..., seq_len, d_model) -> (..., heads, seq_len, d_head)
        return t.reshape(*batch, seq_len, num_heads, d_head).transpose(-3, -2)

    causal = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=in_features.device))
    out = scaled_dot_product_attention(split(q), split(k), split(v))
    out = out.transpose(-3, -2).reshape(*batch, seq_len, d_model)
    return out @ o_proj_weight.T
