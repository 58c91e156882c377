# Correct: one ModuleList per role (q_heads, k_heads, v_heads) holding a small Linear per head; each
# head attends with einsum and the heads are concatenated, then projected.
import math

import torch
from torch import nn


class ListHeadsAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        d_k = d_model // num_heads
        self.q_heads = nn.ModuleList([nn.Linear(d_model, d_k) for _ in range(num_heads)])
        self.k_heads = nn.ModuleList([nn.Linear(d_model, d_k) for _ in range(num_heads)])
        self.v_heads = nn.ModuleList([nn.Linear(d_model, d_k) for _ in range(num_heads)])
        self.out = nn.Linear(d_model, d_model)

    def forward(self, queries, keys, values, mask=None):
        outputs = []
        for wq, wk, wv in zip(self.q_heads, self.k_heads, self.v_heads):
            q, k, v = wq(queries), wk(keys), wv(values)
            scores = torch.einsum("bqd,bkd->bqk", q, k) / math.sqrt(q.shape[-1])
            if mask is not None:
                scores = scores.masked_fill(~mask, float("-inf"))
            outputs.append(torch.einsum("bqk,bkd->bqd", scores.softmax(-1), v))
        return self.out(torch.cat(outputs, dim=-1))
