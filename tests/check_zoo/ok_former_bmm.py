# Correct: the "transformers from scratch" blog layout: emb and heads, bias-free tokeys/toqueries/
# tovalues, the scale split as s**(1/4) on queries and keys, heads folded for bmm, an optional causal
# mask written in place with triu_indices.
import torch
import torch.nn.functional as F
from torch import nn


def mask_(matrices, maskval=0.0, mask_diagonal=True):
    h, w = matrices.size(-2), matrices.size(-1)
    indices = torch.triu_indices(h, w, offset=0 if mask_diagonal else 1)
    matrices[..., indices[0], indices[1]] = maskval


class SelfAttention(nn.Module):
    def __init__(self, emb, heads=8, mask=False):
        super().__init__()
        assert emb % heads == 0
        self.emb, self.heads, self.mask = emb, heads, mask
        self.tokeys = nn.Linear(emb, emb, bias=False)
        self.toqueries = nn.Linear(emb, emb, bias=False)
        self.tovalues = nn.Linear(emb, emb, bias=False)
        self.unifyheads = nn.Linear(emb, emb)

    def forward(self, x):
        b, t, e = x.size()
        h = self.heads
        s = e // h
        keys = self.tokeys(x).view(b, t, h, s)
        queries = self.toqueries(x).view(b, t, h, s)
        values = self.tovalues(x).view(b, t, h, s)
        keys = keys.transpose(1, 2).contiguous().view(b * h, t, s)
        queries = queries.transpose(1, 2).contiguous().view(b * h, t, s)
        values = values.transpose(1, 2).contiguous().view(b * h, t, s)
        queries = queries / (s ** (1 / 4))
        keys = keys / (s ** (1 / 4))
        dot = torch.bmm(queries, keys.transpose(1, 2))
        if self.mask:
            mask_(dot, maskval=float("-inf"), mask_diagonal=False)
        dot = F.softmax(dot, dim=2)
        out = torch.bmm(dot, values).view(b, h, t, s)
        out = out.transpose(1, 2).contiguous().view(b, t, s * h)
        return self.unifyheads(out)
