"""A padding mask whose comment says 1 = keep, but whose code blocks where it is 1. Valid as written for a
caller who passes 1 = blocked; wrong for the caller the comment describes (``--call mask=keep``)."""

import math

import torch
import torch.nn.functional as F
from torch import nn


class PaddingAwareAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.d_k = n_heads, d_model // n_heads
        self.w_q = nn.Linear(d_model, d_model)
        self.w_k = nn.Linear(d_model, d_model)
        self.w_v = nn.Linear(d_model, d_model)
        self.w_o = nn.Linear(d_model, d_model)

    def forward(self, x, mask=None):
        # mask: (batch, seq_len), 1 = keep this token, 0 = padding
        b, t, _ = x.shape
        q = self.w_q(x).view(b, t, self.n_heads, self.d_k).transpose(1, 2)
        k = self.w_k(x).view(b, t, self.n_heads, self.d_k).transpose(1, 2)
        v = self.w_v(x).view(b, t, self.n_heads, self.d_k).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask[:, None, None, :] == 1, -1e9)
        attn = F.softmax(scores, dim=-1)
        out = (attn @ v).transpose(1, 2).contiguous().view(b, t, -1)
        return self.w_o(out)
