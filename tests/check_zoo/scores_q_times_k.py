# Self-attention whose scores forget to transpose the keys: q @ k.
import torch
import torch.nn as nn


class ScoresNoT(nn.Module):
    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h = num_heads
        self.dk = d_model // num_heads
        self.query_proj = nn.Linear(d_model, d_model)
        self.key_proj = nn.Linear(d_model, d_model)
        self.value_proj = nn.Linear(d_model, d_model)
        self.final = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, L, D = x.shape
        q = self.query_proj(x).view(B, L, self.h, self.dk).transpose(1, 2)
        k = self.key_proj(x).view(B, L, self.h, self.dk).transpose(1, 2)
        v = self.value_proj(x).view(B, L, self.h, self.dk).transpose(1, 2)
        scores = torch.matmul(q, k) / self.dk ** 0.5
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, v).transpose(1, 2).reshape(B, L, D)
        return self.final(out)
