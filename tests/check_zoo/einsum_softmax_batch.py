# Sequence-first einsum attention whose nn.Softmax(dim=2) normalises over the batch axis of (i, j, b, h).
import math

import torch
import torch.nn as nn


class LabmlLike(nn.Module):
    def __init__(self, heads, d_model, dropout_prob=0.1):
        super().__init__()
        self.heads, self.d_k = heads, d_model // heads
        self.query = nn.Linear(d_model, d_model)
        self.key = nn.Linear(d_model, d_model)
        self.value = nn.Linear(d_model, d_model)
        self.output = nn.Linear(d_model, d_model)
        self.softmax = nn.Softmax(dim=2)
        self.dropout = nn.Dropout(dropout_prob)

    def forward(self, query, key, value, mask=None):
        seq_len, batch_size, _ = query.shape
        q = self.query(query).view(seq_len, batch_size, self.heads, self.d_k)
        k = self.key(key).view(key.shape[0], batch_size, self.heads, self.d_k)
        v = self.value(value).view(value.shape[0], batch_size, self.heads, self.d_k)
        scores = torch.einsum("ibhd,jbhd->ijbh", q, k) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(-1) == 0, float("-inf"))
        attn = self.dropout(self.softmax(scores))
        x = torch.einsum("ijbh,jbhd->ibhd", attn, v)
        return self.output(x.reshape(seq_len, batch_size, -1))
