# Correct: the compact ViT layout that normalises its input first: self.norm = LayerNorm(dim) is
# applied inside forward, so the projections never see x itself.
import torch
from torch import nn


class PreNormAttention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.scale = dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, 3 * inner, bias=False)
        self.to_out = nn.Linear(inner, dim)

    def forward(self, x):
        b, n, _ = x.shape
        x = self.norm(x)
        q, k, v = (t.view(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
        return self.to_out((attn @ v).transpose(1, 2).reshape(b, n, -1))
