# Correct: a list of single-head modules, each with its own three Linears, then an output layer.
import torch
from torch import nn


class OneHead(nn.Module):
    def __init__(self, dim, head_size):
        super().__init__()
        self.key = nn.Linear(dim, head_size, bias=False)
        self.query = nn.Linear(dim, head_size, bias=False)
        self.value = nn.Linear(dim, head_size, bias=False)

    def forward(self, x):
        k, q = self.key(x), self.query(x)
        wei = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5
        return wei.softmax(dim=-1) @ self.value(x)


class ManyHeads(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.heads = nn.ModuleList([OneHead(dim, dim // n_heads) for _ in range(n_heads)])
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        return self.proj(torch.cat([h(x) for h in self.heads], dim=-1))
