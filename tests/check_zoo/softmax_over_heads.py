# Batch-first attention that copied nn.Softmax(dim=1) from a sequence-first tutorial.
import math

import torch
import torch.nn as nn


class MyMHA(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.q = nn.Linear(embed_dim, embed_dim)
        self.k = nn.Linear(embed_dim, embed_dim)
        self.v = nn.Linear(embed_dim, embed_dim)
        self.o = nn.Linear(embed_dim, embed_dim)
        self.softmax = nn.Softmax(dim=1)

    def forward(self, x):
        B, L, E = x.shape
        q = self.q(x).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k(x).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        attn = self.softmax(scores)
        out = torch.matmul(attn, v).transpose(1, 2).contiguous().view(B, L, E)
        return self.o(out)
