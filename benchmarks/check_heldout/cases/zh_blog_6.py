"""从零手写多头注意力（Multi-Head Attention）

思路：
1. 用三个线性层把输入分别映射成 Q、K、V；
2. 把 d_model 拆成 num_heads 个头，每个头的维度 d_k = d_model / num_heads；
3. 每个头做缩放点积注意力：softmax(Q K^T / sqrt(d_k)) V；
4. 把各个头的结果拼回去，再过一个输出线性层 W_o。

mask 的约定：形状可以广播到 (batch, 1, 查询长度, 键长度)，值为 0 的位置表示“不能看”。"""
import math

import torch
import torch.nn as nn


class MultiHeadAttention(nn.Module):
    def __init__(self, d_model, num_heads):
        super(MultiHeadAttention, self).__init__()
        assert d_model % num_heads == 0, "d_model 必须能被 num_heads 整除"
        self.d_model = d_model
        self.num_heads = num_heads
        self.d_k = d_model // num_heads   # 每个头的维度

        self.W_q = nn.Linear(d_model, d_model)
        self.W_k = nn.Linear(d_model, d_model)
        self.W_v = nn.Linear(d_model, d_model)
        self.W_o = nn.Linear(d_model, d_model)

    def scaled_dot_product_attention(self, Q, K, V, mask=None):
        # 注意力分数：(batch, 头数, 查询长度, 键长度)
        attn_scores = torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.d_k)
        if mask is not None:
            # mask 为 0 的位置填一个很大的负数，softmax 之后权重约等于 0
            attn_scores = attn_scores.masked_fill(mask == 0, -1e9)
        attn_probs = torch.softmax(attn_scores, dim=-1)
        return torch.matmul(attn_probs, V)

    def split_heads(self, x):
        # (batch, 长度, d_model) -> (batch, 头数, 长度, d_k)
        batch_size, seq_length, d_model = x.size()
        return x.view(batch_size, seq_length, self.num_heads, self.d_k).transpose(1, 2)

    def combine_heads(self, x):
        # (batch, 头数, 长度, d_k) -> (batch, 长度, d_model)
        batch_size, _, seq_length, d_k = x.size()
        return x.transpose(1, 2).contiguous().view(batch_size, seq_length, self.d_model)

    def foward(self, Q, K, V, mask=None):
        Q = self.split_heads(self.W_q(Q))
        K = self.split_heads(self.W_k(K))
        V = self.split_heads(self.W_v(V))

        attn_output = self.scaled_dot_product_attention(Q, K, V, mask)
        output = self.W_o(self.combine_heads(attn_output))
        return output
