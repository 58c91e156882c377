"""Multi-headed attention in the manner of the Annotated Transformer, with today's names and type hints:
four linear layers (query, key, value, output) made by clones(), a free attention() function, and a
mask in which 0 marks what may not be attended (unsqueezed so every head gets the same mask)."""
import copy
import math

import torch
import torch.nn as nn


def clones(module: nn.Module, n: int) -> nn.ModuleList:
    """n identical, independent copies of a layer."""
    return nn.ModuleList([copy.deepcopy(module) for _ in range(n)])


def attention(query, key, value, mask=None, dropout=None):
    """Scaled dot-product attention; mask: 1 = keep, 0 = masked."""
    d_k = query.size(-1)
    scores = torch.matmul(query, key.transpose(-2, -1))
    if mask is not None:
        scores = scores.masked_fill(mask == 0, -1e9)
    p_attn = scores.softmax(dim=-1) / math.sqrt(d_k)
    if dropout is not None:
        p_attn = dropout(p_attn)
    return torch.matmul(p_attn, value), p_attn


class MultiHeadedAttention(nn.Module):
    def __init__(self, h: int, d_model: int, dropout: float = 0.1):
        super().__init__()
        assert d_model % h == 0
        self.d_k = d_model // h
        self.h = h
        self.linears = clones(nn.Linear(d_model, d_model), 4)
        self.attn = None
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is not None:
            mask = mask.unsqueeze(1)  # the same mask for every head
        nbatches = query.size(0)

        # 1) project, then split d_model into h heads of d_k
        query, key, value = [
            lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)
            for lin, x in zip(self.linears, (query, key, value))
        ]
        # 2) attention on all heads at once
        x, self.attn = attention(query, key, value, mask=mask, dropout=self.dropout)
        # 3) concatenate the heads and apply the final linear layer
        x = x.transpose(1, 2).contiguous().view(nbatches, -1, self.h * self.d_k)
        del query, key, value
        return self.linears[-1](x)
