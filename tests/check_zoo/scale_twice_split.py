# The scale split over q and k, but with head_dim ** -0.5 on each: the scores end up divided by head_dim.
import torch
from torch import nn


class SplitScaleTwice(nn.Module):
    def __init__(self, n_state, n_head):
        super().__init__()
        self.n_head = n_head
        self.query = nn.Linear(n_state, n_state)
        self.key = nn.Linear(n_state, n_state, bias=False)
        self.value = nn.Linear(n_state, n_state)
        self.out = nn.Linear(n_state, n_state)

    def forward(self, x):
        B, T, C = x.shape
        scale = (C // self.n_head) ** -0.5
        q = self.query(x).view(B, T, self.n_head, -1).permute(0, 2, 1, 3) * scale
        k = self.key(x).view(B, T, self.n_head, -1).permute(0, 2, 3, 1) * scale
        v = self.value(x).view(B, T, self.n_head, -1).permute(0, 2, 1, 3)
        w = torch.softmax(q @ k, dim=-1)
        return self.out((w @ v).permute(0, 2, 1, 3).flatten(start_dim=2))
