"""A course's multi-head attention written as one function of its input and its weight matrices (x @ W,
W stored (in, out)), the way a numpy-first course writes it before nn.Module."""

import math

import torch


def multi_head_attention(x, w_q, w_k, w_v, w_o, num_heads, mask=None):
    batch, seq_len, d_model = x.shape
    d_head = d_model // num_heads

    def split(t):
        return t.reshape(batch, seq_len, num_heads, d_head).transpose(1, 2)

    q, k, v = split(x @ w_q), split(x @ w_k), split(x @ w_v)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)
    if mask is not None:  # mask: (batch, seq_len, seq_len), True where a query may look
        scores = scores.masked_fill(~mask[:, None], float("-inf"))
    heads = torch.softmax(scores, dim=-1) @ v
    return heads.transpose(1, 2).reshape(batch, seq_len, d_model) @ w_o
