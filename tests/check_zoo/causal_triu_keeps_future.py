"""A learner's first causal mask: ``torch.triu`` where ``torch.tril`` was meant, then ``masked_fill(mask == 0,
-inf)``: each token sees itself and the tokens after it, never the ones before. (The qkv layer is split with
``split(E)``.)"""

import torch
from torch import nn


class MyCausalAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, max_len=64):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, embed_dim // num_heads
        self.embed_dim = embed_dim
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.out = nn.Linear(embed_dim, embed_dim)
        self.register_buffer("mask", torch.triu(torch.ones(max_len, max_len)))

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.qkv(x).split(self.embed_dim, dim=2)
        q = q.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * self.head_dim ** -0.5
        att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf"))
        att = torch.softmax(att, dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, E)
        return self.out(y)
