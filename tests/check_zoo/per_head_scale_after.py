# One small Linear per head for each of q, k, v (ModuleLists); the scale comes after the softmax.
import torch
import torch.nn as nn


class PerHeadAttention(nn.Module):
    def __init__(self, hidden_size, num_heads):
        super().__init__()
        d = hidden_size // num_heads
        self.d = d
        self.fq = nn.ModuleList([nn.Linear(hidden_size, d) for _ in range(num_heads)])
        self.fk = nn.ModuleList([nn.Linear(hidden_size, d) for _ in range(num_heads)])
        self.fv = nn.ModuleList([nn.Linear(hidden_size, d) for _ in range(num_heads)])
        self.out = nn.Linear(hidden_size, hidden_size)

    def forward(self, x):
        heads = []
        for fq, fk, fv in zip(self.fq, self.fk, self.fv):
            w = torch.softmax(fq(x) @ fk(x).transpose(1, 2), dim=-1) / self.d ** 0.5
            heads.append(w @ fv(x))
        return self.out(torch.cat(heads, dim=-1))
