"""带因果掩码的多头注意力（参数直接用 nn.Parameter，计算写成 x @ W）。

因果掩码：第 i 个词只能看到它自己和它前面的词，所以把上三角（未来的位置）填成 -inf。"""
import torch
import torch.nn as nn


class CausalMultiHeadAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, num_heads, dropout=0.0):
        super().__init__()
        assert d_out % num_heads == 0, "d_out 必须能被 num_heads 整除"
        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        # 三个投影矩阵，形状 (d_in, d_out)，用法是 x @ W
        self.W_q = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)
        self.W_k = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)
        self.W_v = nn.Parameter(torch.randn(d_in, d_out) / d_in ** 0.5)
        self.out_proj = nn.Linear(d_out, d_out)
        self.dropout = nn.Dropout(dropout)
        # 上三角为 1 的位置是“未来”，需要屏蔽
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=2))

    def forward(self, x):
        b, n, _ = x.shape
        q = (x @ self.W_q).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # (b, 头数, n, head_dim)
        k = (x @ self.W_k).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        v = (x @ self.W_v).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)

        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5   # (b, 头数, n, n)
        scores = scores.masked_fill(self.mask[:n, :n].bool(), float("-inf"))
        weights = self.dropout(torch.softmax(scores, dim=-1))

        out = (weights @ v).transpose(1, 2).reshape(b, n, self.d_out)   # 合并多头
        return self.out_proj(out)
