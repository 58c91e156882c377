# d2l-style folded heads (B*H, L, D) with valid_lens, scaled by the whole width instead of one head's.
import math

import torch
from torch import nn


def fold(x, h):
    b, n, _ = x.shape
    x = x.reshape(b, n, h, -1).permute(0, 2, 1, 3)
    return x.reshape(-1, n, x.shape[-1])


def unfold(x, h):
    x = x.reshape(-1, h, x.shape[1], x.shape[2]).permute(0, 2, 1, 3)
    return x.reshape(x.shape[0], x.shape[1], -1)


class FoldedAttention(nn.Module):
    def __init__(self, key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.num_hiddens = num_hiddens
        self.drop = nn.Dropout(dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        q, k, v = fold(self.W_q(queries), self.num_heads), fold(self.W_k(keys), self.num_heads), \
            fold(self.W_v(values), self.num_heads)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(self.num_hiddens)
        if valid_lens is not None:
            lens = torch.repeat_interleave(valid_lens, self.num_heads, dim=0)
            cols = torch.arange(scores.shape[-1])[None, None, :]
            scores = scores.masked_fill(cols >= lens[:, None, None], -1e6)
        out = torch.bmm(self.drop(torch.softmax(scores, dim=-1)), v)
        return self.W_o(unfold(out, self.num_heads))
