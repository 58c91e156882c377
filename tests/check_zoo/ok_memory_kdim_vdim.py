# Correct: queries attend over a memory whose keys and values have their own widths (kdim, vdim),
# as nn.MultiheadAttention allows; heads folded into the batch for torch.bmm.
import torch
from torch import nn


class MemoryAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None):
        super().__init__()
        self.num_heads = num_heads
        self.read_q = nn.Linear(embed_dim, embed_dim)
        self.read_k = nn.Linear(kdim or embed_dim, embed_dim)
        self.read_v = nn.Linear(vdim or embed_dim, embed_dim)
        self.write = nn.Linear(embed_dim, embed_dim)

    def fold(self, t):
        b, n, e = t.shape
        return t.reshape(b, n, self.num_heads, e // self.num_heads).transpose(1, 2).reshape(b * self.num_heads, n, -1)

    def forward(self, query, keys, values):
        b, n, e = query.shape
        q, k, v = self.fold(self.read_q(query)), self.fold(self.read_k(keys)), self.fold(self.read_v(values))
        w = torch.bmm(q, k.transpose(1, 2)).div(q.shape[-1] ** 0.5).softmax(dim=2)
        out = torch.bmm(w, v).reshape(b, self.num_heads, n, -1).transpose(1, 2).reshape(b, n, e)
        return self.write(out)
