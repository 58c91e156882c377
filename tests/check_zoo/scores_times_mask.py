# The mask multiplies the scores before the softmax: blocked scores become 0, and exp(0) = 1 still
# gives those keys weight.
import math

import torch
from torch import nn


class MaskedProduct(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q = nn.Linear(embed_dim, embed_dim)
        self.kv = nn.Linear(embed_dim, 2 * embed_dim)
        self.o = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, padding_mask=None):
        B, L, E = x.shape
        k, v = self.kv(x).chunk(2, dim=-1)
        q, k, v = (t.view(B, L, self.num_heads, -1).transpose(1, 2) for t in (self.q(x), k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(E // self.num_heads)
        if padding_mask is not None:
            scores = scores * padding_mask[:, None, None, :]  # 1 = real token, 0 = padding
        out = torch.softmax(scores, dim=-1) @ v
        return self.o(out.transpose(1, 2).reshape(B, L, E))
