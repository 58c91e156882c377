# Correct: sequence-first (L, B, E) einsum attention with a (Lq, Lk, B) keep mask.
import math

import torch
from torch import nn


class TimeMajorAttention(nn.Module):
    def __init__(self, heads, d_model):
        super().__init__()
        self.heads, self.d = heads, d_model // heads
        self.fq = nn.Linear(d_model, d_model)
        self.fk = nn.Linear(d_model, d_model)
        self.fv = nn.Linear(d_model, d_model)
        self.fo = nn.Linear(d_model, d_model)

    def forward(self, query, key, value, mask=None):
        i, b, _ = query.shape
        q = self.fq(query).view(i, b, self.heads, self.d)
        k = self.fk(key).view(key.shape[0], b, self.heads, self.d)
        v = self.fv(value).view(value.shape[0], b, self.heads, self.d)
        s = torch.einsum("ibhd,jbhd->ijbh", q, k) / math.sqrt(self.d)
        if mask is not None:
            s = s.masked_fill(mask.unsqueeze(-1) == 0, float("-inf"))
        a = torch.softmax(s, dim=1)
        x = torch.einsum("ijbh,jbhd->ibhd", a, v)
        return self.fo(x.reshape(i, b, -1))
