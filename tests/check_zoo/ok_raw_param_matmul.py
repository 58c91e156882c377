# Correct: the "from scratch" style with nn.Parameter matrices (d_in, d_out) multiplied from the right,
# x @ W, then split into heads; the output matrix is stored (d_out, d_out) and applied transposed.
import torch
from torch import nn


class ParamMatrixAttention(nn.Module):
    def __init__(self, d_in, d_out, num_heads):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, d_out // num_heads
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))
        self.W_out = nn.Parameter(torch.rand(d_out, d_out))

    def forward(self, x):
        b, t, _ = x.shape
        queries = (x @ self.W_query).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        keys = (x @ self.W_key).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        values = (x @ self.W_value).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        attn_scores = queries @ keys.transpose(2, 3)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        context = (attn_weights @ values).transpose(1, 2).reshape(b, t, -1)
        return context @ self.W_out.T
