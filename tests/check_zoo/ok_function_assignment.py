"""An assignment's attention function: Q, K, V (batch, seq, d_k), one head, and a mask whose zeros mark the
positions to ignore; it returns the output and the attention weights."""

import numpy as np
import torch
import torch.nn.functional as F


def attention(Q, K, V, mask=None):
    d_k = Q.shape[-1]
    scores = torch.matmul(Q, K.transpose(-2, -1)) / np.sqrt(d_k)
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = F.softmax(scores, dim=-1)
    return torch.matmul(p_attn, V), p_attn
