# Sequence-first einsum attention (labml style) normalising over the queries axis (dim=0).
import torch
from torch import nn


class SeqAttention(nn.Module):
    def __init__(self, heads, d_model):
        super().__init__()
        self.heads = heads
        self.d_k = d_model // heads
        self.lin_a = nn.Linear(d_model, d_model)
        self.lin_b = nn.Linear(d_model, d_model)
        self.lin_c = nn.Linear(d_model, d_model)
        self.lin_d = nn.Linear(d_model, d_model)

    def forward(self, query, key, value):
        Lq, B, _ = query.shape
        q = self.lin_a(query).view(Lq, B, self.heads, self.d_k)
        k = self.lin_b(key).view(key.shape[0], B, self.heads, self.d_k)
        v = self.lin_c(value).view(value.shape[0], B, self.heads, self.d_k)
        s = torch.einsum("ibhd,jbhd->ijbh", q, k) / self.d_k ** 0.5
        a = s.softmax(dim=0)
        x = torch.einsum("ijbh,jbhd->ibhd", a, v).reshape(Lq, B, -1)
        return self.lin_d(x)
