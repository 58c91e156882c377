"""手写多头自注意力（MultiHeadSelfAttention），一步一步来。

输入 X 的形状是 (batch, seq_len, hidden_dim)，hidden_dim 被平均分给 head_num 个头，
每个头的维度 head_dim = hidden_dim // head_num。

attention_mask：可以广播到 (batch, head_num, seq_len, seq_len)，值为 0 的位置表示“不能看”，
例如把 (batch, seq_len) 的 padding 掩码 unsqueeze(1).unsqueeze(2) 之后传进来。"""
import math

import torch
import torch.nn as nn


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, hidden_dim, head_num, attention_dropout_rate=0.1):
        super().__init__()
        self.hidden_dim = hidden_dim
        self.head_num = head_num
        self.head_dim = hidden_dim // head_num

        # 一般写成 hidden_dim -> head_num * head_dim，两者相等
        self.q_proj = nn.Linear(hidden_dim, hidden_dim)
        self.k_proj = nn.Linear(hidden_dim, hidden_dim)
        self.v_proj = nn.Linear(hidden_dim, hidden_dim)
        self.o_proj = nn.Linear(hidden_dim, hidden_dim)

        self.attention_dropout = nn.Dropout(attention_dropout_rate)

    def foward(self, X, attention_mask=None):
        batch, seq_len, _ = X.size()

        Q = self.q_proj(X)
        K = self.k_proj(X)
        V = self.v_proj(X)

        # (b, s, h) -> (b, s, head_num, head_dim) -> (b, head_num, s, head_dim)
        q_state = Q.view(batch, seq_len, self.head_num, self.head_dim).permute(0, 2, 1, 3)
        k_state = K.view(batch, seq_len, self.head_num, self.head_dim).permute(0, 2, 1, 3)
        v_state = V.view(batch, seq_len, self.head_num, self.head_dim).permute(0, 2, 1, 3)

        # 注意力分数：(b, head_num, s, s)，除以 sqrt(head_dim) 防止数值过大
        attention_weight = torch.matmul(q_state, k_state.transpose(-1, -2)) / math.sqrt(self.head_dim)

        if attention_mask is not None:
            # 掩码为 0 的位置填一个极小的数，softmax 之后几乎为 0
            attention_weight = attention_weight.masked_fill(attention_mask == 0, float("-1e20"))

        # 在最后一维（键的维度）上做 softmax
        attention_weight = torch.softmax(attention_weight, dim=3)
        attention_weight = self.attention_dropout(attention_weight)

        output_mid = attention_weight @ v_state            # (b, head_num, s, head_dim)

        # 先把头的维度换回去，再拼接：(b, s, head_num, head_dim) -> (b, s, hidden_dim)
        output_mid = output_mid.transpose(1, 2).contiguous()
        output = output_mid.view(batch, seq_len, -1)

        output = self.o_proj(output)
        return output
