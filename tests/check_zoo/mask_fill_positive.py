"""``masked_fill(mask == 0, 1e9)``: the learner uses masked_fill with the right condition but a positive fill,
so the blocked keys take all the weight instead of none."""

import math

import torch
from torch import nn


class PaddedAttention(nn.Module):
    def __init__(self, d_model, h):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])

    def forward(self, query, key, value, mask=None):
        n = query.size(0)
        query, key, value = [lin(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value))]
        scores = torch.matmul(query, key.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1) == 0, 1e9)
        p_attn = scores.softmax(dim=-1)
        x = torch.matmul(p_attn, value).transpose(1, 2).contiguous().view(n, -1, self.h * self.d_k)
        return self.linears[-1](x)
