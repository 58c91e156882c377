# 手撕 GQA（分组查询注意力），面试题里常见的写法
# 思路：query 有 nums_head 个头，key/value 只有 nums_key_value_head 个头，
# 每个 kv 头负责相邻的一组 query 头，所以要用 repeat_interleave 把 kv 头“按组”复制。
import math

import torch
import torch.nn as nn


class GroupQueryAttention(nn.Module):
    def __init__(self, hidden_dim, nums_head, nums_key_value_head):
        super().__init__()
        assert hidden_dim % nums_head == 0  # 能整除
        assert nums_head % nums_key_value_head == 0  # 一组有几个 query 头
        self.hidden_dim = hidden_dim
        self.nums_head = nums_head
        self.nums_key_value_head = nums_key_value_head
        self.head_dim = hidden_dim // nums_head

        self.q_proj = nn.Linear(hidden_dim, nums_head * self.head_dim)
        # k、v 的输出维度变小了：只有 nums_key_value_head 个头
        self.k_proj = nn.Linear(hidden_dim, nums_key_value_head * self.head_dim)
        self.v_proj = nn.Linear(hidden_dim, nums_key_value_head * self.head_dim)
        self.o_proj = nn.Linear(hidden_dim, hidden_dim)

    def forward(self, X, attention_mask=None):
        # X 的形状：(batch, seq, hidden_dim)；attention_mask：(batch, seq)，1 表示真实 token，0 表示 padding
        batch_size, seq, _ = X.size()

        q = self.q_proj(X).view(batch_size, seq, self.nums_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(X).view(batch_size, seq, self.nums_key_value_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(X).view(batch_size, seq, self.nums_key_value_head, self.head_dim).transpose(1, 2)

        # 按组复制：kv 头 0 给 query 头 0、1，kv 头 1 给 query 头 2、3 ……
        group = self.nums_head // self.nums_key_value_head
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)

        attention_score = (q @ k.transpose(2, 3)) / math.sqrt(self.head_dim)  # (b, 头数, seq, seq)

        # 因果掩码：下三角为 1，第 i 个位置只能看到 0..i
        causal = torch.tril(torch.ones(seq, seq, device=X.device))
        attention_score = attention_score.masked_fill(causal == 0, float("-inf"))
        if attention_mask is not None:
            attention_score = attention_score.masked_fill(attention_mask[:, None, None, :] == 0, float("-inf"))

        attention_weight = torch.softmax(attention_score, dim=-1)
        output = attention_weight @ v  # (b, 头数, seq, head_dim)
        output = output.transpose(1, 2).contiguous().view(batch_size, seq, -1)
        return self.o_proj(output)
