"""仿 Step-3 的注意力写法（多矩阵分解注意力，MFA）。

- query 走低秩路径：q_proj 先压到 share_q_dim，经过 inter_norm（RMSNorm），再由 wq 展开成所有头；
- key 和 value 都只有一个头（多查询注意力 MQA），所有 query 头共用；
- 旋转位置编码是前后两半配对的写法，最后是因果注意力和输出投影 o_proj。
"""
import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class Step3Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.rope_theta = config.rope_theta
        self.q_proj = nn.Linear(config.hidden_size, config.share_q_dim, bias=False)
        self.inter_norm = RMSNorm(config.share_q_dim, eps=config.rms_norm_eps)
        self.wq = nn.Linear(config.share_q_dim, self.num_heads * self.head_dim, bias=False)
        # 只有一个 kv 头
        self.k_proj = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        bsz, seq_len, _ = hidden_states.shape
        q = self.wq(self.inter_norm(self.q_proj(hidden_states)))
        q = q.view(bsz, seq_len, self.num_heads, self.head_dim).transpose(1, 2)  # (bsz, 头数, 长度, head_dim)
        k = self.k_proj(hidden_states).view(bsz, 1, seq_len, self.head_dim)       # 单头
        v = self.v_proj(hidden_states).view(bsz, 1, seq_len, self.head_dim)

        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        # 广播：一个 kv 头给所有 query 头用
        k = k.expand(bsz, self.num_heads, seq_len, self.head_dim)
        v = v.expand(bsz, self.num_heads, seq_len, self.head_dim)

        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        future = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=q.device), diagonal=1)
        scores = scores.masked_fill(future, float("-inf"))  # 不许看未来的 token
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, v).transpose(1, 2).reshape(bsz, seq_len, -1)
        return self.o_proj(out)
