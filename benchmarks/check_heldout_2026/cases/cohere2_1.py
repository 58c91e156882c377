"""仿照 Cohere2（Command R7B / Command A）写的注意力层。

Cohere 的旋转位置编码是“相邻两个数一组”的交错写法：cos/sin 用 repeat_interleave 展开，
rotate_half 也是把 (x0, x1) 变成 (-x1, x0) 这样成对处理。
滑动窗口层（sliding window）里每个 token 只看自己和前面 sliding_window - 1 个 token；
每隔 sliding_window_pattern 层才有一层全局注意力（全局层不加位置编码）。
"""
import math

import torch
from torch import nn


def rotate_half(x):
    # 交错配对：(x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)
    x1 = x[..., ::2]
    x2 = x[..., 1::2]
    return torch.stack([-x2, x1], dim=-1).flatten(-2)


class Cohere2Attention(nn.Module):
    def __init__(self, config, layer_idx=0):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.rope_theta = config.rope_theta
        is_sliding = (layer_idx + 1) % config.sliding_window_pattern != 0
        self.sliding_window = config.sliding_window if is_sliding else None
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        q = self.q_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(hidden_states).view(bsz, q_len, -1, self.head_dim).transpose(1, 2)

        if self.sliding_window is not None:  # 只有滑动窗口层才加旋转位置编码
            inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
            freqs = torch.outer(torch.arange(q_len, dtype=torch.float64), inv_freq)
            emb = torch.repeat_interleave(freqs, 2, dim=-1)
            cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin

        n_rep = self.num_heads // self.num_key_value_heads
        k = k.repeat_interleave(n_rep, dim=1)
        v = v.repeat_interleave(n_rep, dim=1)

        scores = q @ k.transpose(2, 3) / math.sqrt(self.head_dim)
        i = torch.arange(q_len, device=q.device)[:, None]
        j = torch.arange(q_len, device=q.device)[None, :]
        allowed = j <= i  # 因果
        if self.sliding_window is not None:
            allowed = allowed & (i - j < self.sliding_window)  # 窗口内（包括自己）
        scores = scores.masked_fill(~allowed, float("-inf"))
        probs = scores.softmax(dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(out)
