"""Document 001's code: attention_v1.py's CausalAttention, the stacked and the weight-split versions.

``CausalAttention`` is the standard public single causal head the document loads with
``%run attention_v1.py`` (not shown in the document). The rest follows the document's cells, including
the prints in the split version's forward and the ``setattr`` that attaches it.
"""

import torch
import torch.nn as nn

# The document's example input ("Your journey starts with one step"), 6 tokens x 3 dims.
inputs = torch.tensor(
    [[0.43, 0.15, 0.89],  # Your
     [0.55, 0.87, 0.66],  # journey
     [0.57, 0.85, 0.64],  # starts
     [0.22, 0.58, 0.33],  # with
     [0.77, 0.25, 0.10],  # one
     [0.05, 0.80, 0.55]]  # step
)


class CausalAttention(nn.Module):
    def __init__(self, d_in, d_out, context_length, dropout, qkv_bias=False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer('mask', torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x):
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1]**0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        context_vec = attn_weights @ values
        return context_vec


class MultiHeadAttentionStack(nn.Module):
    def __init__(self, dim_in, dim_out, context_length, dropout_rate, num_heads):
        super().__init__()
        # 构建多头注意力
        multi_attens = [CausalAttention(dim_in, dim_out, context_length, dropout_rate)
                        for i in range(num_heads)]
        self.heads = nn.ModuleList(multi_attens)

    def forward(self, x):
        context_vecs = [head(x) for head in self.heads]
        return torch.concat(context_vecs, dim=-1)


class MultiHeadAttention(nn.Module):
    def __init__(self, dim_in, dim_out, context_length, dropout_rate, num_heads, qkv_bias=False):
        super().__init__()
        assert dim_out % num_heads == 0, "dim_out must be divisible by num_heads"

        self.dim_out = dim_out
        self.num_heads = num_heads
        self.head_dim = dim_out // num_heads   # 每个头的维度

        self.Wq = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.Wk = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.Wv = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.Wo = nn.Linear(dim_out, dim_out)
        self.dropout = nn.Dropout(dropout_rate)

        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))


def forward(self, x):
    b, num_tokens, dim_in = x.shape
    # 求Q/K/V矩阵，shape为（b, num_tokens, dim_out）
    q = self.Wq(x)
    k = self.Wk(x)
    v = self.Wv(x)

    # 多头注意力矩阵分割
    # 变换形状，使用view将dim_out -> num_heads, head_dim
    # shape=(b, num_tokens, num_heads, head_dim)
    q = q.view(b, num_tokens, self.num_heads, self.head_dim)
    k = k.view(b, num_tokens, self.num_heads, self.head_dim)
    v = v.view(b, num_tokens, self.num_heads, self.head_dim)

    # 由于计算注意力分数时，需要对每一个头并行计算，这里需要交换第2维和第3维
    # shape：（b, num_heads, num_tokens, self.dim_out）
    q = q.transpose(1, 2)
    k = k.transpose(1, 2)
    v = v.transpose(1, 2)

    # 计算注意力分数,shape=(b, num_heads, num_tokens, num_tokens)
    atten_scores = q @ k.transpose(2, 3)
    atten_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
    atten_weights = torch.softmax(atten_scores / k.shape[-1] ** 0.5, dim=-1)
    atten_weights = self.dropout(atten_weights)

    # 计算上下文张量
    context_vecs = atten_weights @ v  # shape=(b, num_heads, num_tokens, head_dim)
    context_vecs = context_vecs.transpose(1, 2)  # shape=(b, num_tokens, num_heads, head_dim)
    context_vecs = context_vecs.contiguous().view(b, num_tokens, self.dim_out)
    print(context_vecs.shape)
    print(self.Wo)
    output = self.Wo(context_vecs)

    return output


setattr(MultiHeadAttention, "forward", forward)
