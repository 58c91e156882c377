# LazyLinear projections (sizes found on the first call); the output layer is built but never used.
import torch
from torch import nn


class LazyHeads(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.q_lin = nn.LazyLinear(d_model)
        self.k_lin = nn.LazyLinear(d_model)
        self.v_lin = nn.LazyLinear(d_model)
        self.o_lin = nn.LazyLinear(d_model)

    def forward(self, x):
        B, L, E = x.shape
        H = self.num_heads
        q = self.q_lin(x).reshape(B, L, H, E // H).transpose(1, 2)
        k = self.k_lin(x).reshape(B, L, H, E // H).transpose(1, 2)
        v = self.v_lin(x).reshape(B, L, H, E // H).transpose(1, 2)
        w = torch.softmax(q @ k.transpose(-2, -1) / (E // H) ** 0.5, dim=-1)
        return (w @ v).transpose(1, 2).reshape(B, L, E)
