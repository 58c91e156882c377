# Document-001-like heads whose causal buffer also blocks the diagonal (triu with diagonal=0).
import torch
from torch import nn


class MaskedHeads(nn.Module):
    def __init__(self, dim_in, dim_out, context_length, dropout_rate, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim_out // num_heads
        self.dim_out = dim_out
        self.Wq = nn.Linear(dim_in, dim_out, bias=False)
        self.Wk = nn.Linear(dim_in, dim_out, bias=False)
        self.Wv = nn.Linear(dim_in, dim_out, bias=False)
        self.Wo = nn.Linear(dim_out, dim_out)
        self.dropout = nn.Dropout(dropout_rate)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=0))

    def forward(self, x):
        b, n, _ = x.shape
        q = self.Wq(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.Wk(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.Wv(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        s = q @ k.transpose(2, 3)
        s = s.masked_fill(self.mask.bool()[:n, :n], -1e9)
        w = self.dropout(torch.softmax(s / k.shape[-1] ** 0.5, dim=-1))
        ctx = (w @ v).transpose(1, 2).contiguous().view(b, n, self.dim_out)
        return self.Wo(ctx)
