"""编码器里的自注意力，带 padding 掩码。

attention_mask 的约定和分词器（tokenizer）返回的一样：形状 (batch, seq_len)，1 表示真实的词，0 表示填充。
填充的位置不应该被关注，所以在 softmax 之前把这些位置的分数填成 -inf。"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class PaddedSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)   # 一次算出 q、k、v
        self.proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x, attention_mask=None):
        B, L, E = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, L, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))  # (B, 头数, L, 头维度)

        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if attention_mask is not None:
            # (B, L) -> (B, 1, 1, L)，对所有头、所有查询位置都一样
            scores = scores.masked_fill(attention_mask[:, None, None, :] == 1, float("-inf"))
        weights = F.softmax(scores, dim=-1)

        out = (weights @ v).transpose(1, 2).reshape(B, L, E)
        return self.proj(out)
