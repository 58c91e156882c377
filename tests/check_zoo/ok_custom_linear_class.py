# Correct: a Linear of the learner's own (an nn.Module holding weight (out, in) that calls F.linear, as
# DeepSeek's reference inference code does), used for every projection of plain multi-head attention.
import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=False):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        nn.init.normal_(self.weight, std=in_features ** -0.5)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class CustomLinearAttention(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.wq = Linear(dim, dim, bias=True)
        self.wk = Linear(dim, dim)
        self.wv = Linear(dim, dim)
        self.wo = Linear(dim, dim, bias=True)

    def forward(self, x, mask=None):
        bsz, seqlen, _ = x.shape
        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        k = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        v = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        scores = torch.einsum("bshd,bthd->bsht", q, k) * self.head_dim ** -0.5
        if mask is not None:  # (seqlen, seqlen): 0 where a query may look, -inf elsewhere
            scores = scores + mask.unsqueeze(1)
        out = torch.einsum("bsht,bthd->bshd", scores.softmax(dim=-1), v)
        return self.wo(out.flatten(2))
