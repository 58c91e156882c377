# Correct: torch-style key_padding_mask (B, Lk), True = padding, returning (output, weights).
import torch
import torch.nn.functional as F
from torch import nn


class PadAwareAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.proj_query = nn.Linear(embed_dim, embed_dim)
        self.proj_key = nn.Linear(embed_dim, embed_dim)
        self.proj_value = nn.Linear(embed_dim, embed_dim)
        self.proj_out = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, key_padding_mask=None):
        B, Lq, E = query.shape
        Lk = key.shape[1]
        H, D = self.num_heads, E // self.num_heads
        q = self.proj_query(query).view(B, Lq, H, D).transpose(1, 2)
        k = self.proj_key(key).view(B, Lk, H, D).transpose(1, 2)
        v = self.proj_value(value).view(B, Lk, H, D).transpose(1, 2)
        logits = q @ k.transpose(-1, -2) / D ** 0.5
        if key_padding_mask is not None:
            logits = logits.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
        weights = F.softmax(logits, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(B, Lq, E)
        return self.proj_out(out), weights
