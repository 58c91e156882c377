"""A learner's copy of the classic "Transformer from scratch" class with the method name mistyped as
``mask_fill``: it runs without a mask and raises AttributeError as soon as one is given."""

import math

import torch
import torch.nn as nn


class TypoMaskAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads
        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def attend(self, Q, K, V, mask=None):
        attn_scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            attn_scores = attn_scores.mask_fill(mask == 0, -1e9)
        return torch.matmul(torch.softmax(attn_scores, dim=-1), V)

    def split(self, x):
        b, t, _ = x.size()
        return x.view(b, t, self.num_heads, self.d_k).transpose(1, 2)

    def forward(self, Q, K, V, mask=None):
        out = self.attend(self.split(self.W_q(Q)), self.split(self.W_k(K)), self.split(self.W_v(V)), mask)
        b, _, t, _ = out.size()
        return self.W_o(out.transpose(1, 2).contiguous().view(b, t, self.d_model))
