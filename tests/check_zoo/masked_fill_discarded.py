# (x, mask) self-attention where masked_fill's result is thrown away: the mask does nothing.
import math

import torch
from torch import nn


class SelfAttn(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.nh = num_heads
        self.in_q = nn.Linear(d_model, d_model)
        self.in_k = nn.Linear(d_model, d_model)
        self.in_v = nn.Linear(d_model, d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        B, L, E = x.shape
        q, k, v = [f(x).view(B, L, self.nh, -1).transpose(1, 2) for f in (self.in_q, self.in_k, self.in_v)]
        scores = q @ k.transpose(-2, -1) / math.sqrt(E // self.nh)
        if mask is not None:
            scores.masked_fill(mask == 0, float("-inf"))
        return self.out((scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, E))
