# Scores divided by 2 * sqrt(head_dim): with 4 heads the same number as 1/sqrt(embed_dim), told apart by
# measuring the scale and rebuilding with another head count.
import math

import torch
from torch import nn


class HalfScaleAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.head_dim = d_model // num_heads
        self.wq = nn.Linear(d_model, d_model)
        self.wk = nn.Linear(d_model, d_model)
        self.wv = nn.Linear(d_model, d_model)
        self.wo = nn.Linear(d_model, d_model)

    def forward(self, q, k, v):
        B, Lq, E = q.shape
        q = self.wq(q).view(B, Lq, self.h, self.head_dim).transpose(1, 2)
        k = self.wk(k).view(B, -1, self.h, self.head_dim).transpose(1, 2)
        v = self.wv(v).view(B, -1, self.h, self.head_dim).transpose(1, 2)
        temperature = 2 * math.sqrt(self.head_dim)
        weights = torch.softmax(q @ k.transpose(-2, -1) / temperature, dim=-1)
        return self.wo((weights @ v).transpose(1, 2).reshape(B, Lq, E))
