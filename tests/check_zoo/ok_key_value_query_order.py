# Correct: the translation-toolkit layout: forward(key, value, query, mask) with head_count and
# model_dim, shape/unshape helpers, the query divided by sqrt(dim_per_head) first, scores in float32
# and a mask where True marks padding.
import math

import torch
from torch import nn


class MultiHeadedAttention(nn.Module):
    def __init__(self, head_count, model_dim, dropout=0.1):
        super().__init__()
        assert model_dim % head_count == 0
        self.dim_per_head = model_dim // head_count
        self.head_count = head_count
        self.linear_keys = nn.Linear(model_dim, model_dim)
        self.linear_values = nn.Linear(model_dim, model_dim)
        self.linear_query = nn.Linear(model_dim, model_dim)
        self.softmax = nn.Softmax(dim=-1)
        self.dropout = nn.Dropout(dropout)
        self.final_linear = nn.Linear(model_dim, model_dim)

    def forward(self, key, value, query, mask=None):
        batch = key.size(0)

        def shape(x):
            return x.view(batch, -1, self.head_count, self.dim_per_head).transpose(1, 2)

        def unshape(x):
            return x.transpose(1, 2).contiguous().view(batch, -1, self.head_count * self.dim_per_head)

        key, value = shape(self.linear_keys(key)), shape(self.linear_values(value))
        query = shape(self.linear_query(query)) / math.sqrt(self.dim_per_head)
        scores = torch.matmul(query, key.transpose(2, 3)).float()
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1), -1e18)
        attn = self.softmax(scores).to(query.dtype)
        context = unshape(torch.matmul(self.dropout(attn), value))
        return self.final_linear(context), attn[:, 0]
