"""InternLM2 风格的分组查询注意力（GQA）：q、k、v 由同一个 wqkv 线性层一次算出。
输出按 key/value 头分组排列：每组先是这一组的 n_rep 个查询头，再是该组的一个键头和一个值头，
所以拆分时先 view 成 (B, L, 组数, n_rep + 2, head_dim)。位置编码用 rotate_half 形式的 RoPE，带因果掩码。"""
import math

import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):
    """把最后一维分成前后两半，(x1, x2) -> (-x2, x1)"""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class InternLM2Attention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.head_dim = self.hidden_size // self.num_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_key_value_heads  # 每个 KV 头服务的查询头个数
        self.rope_theta = getattr(config, "rope_theta", 10000.0)

        self.wqkv = nn.Linear(self.hidden_size, (self.num_heads + 2 * self.num_key_value_heads) * self.head_dim,
                              bias=getattr(config, "bias", False))
        self.wo = nn.Linear(self.num_heads * self.head_dim, self.hidden_size, bias=getattr(config, "bias", False))

    def _rope(self, seq_len, dtype):
        # 频率 theta_i = base^(-2i/d)，每个位置 m 的转角为 m * theta_i
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.size()

        qkv_states = self.wqkv(hidden_states)
        # (B, L, 组数, n_rep + 2, head_dim)：每组 = n_rep 个 q 头 + 1 个 k 头 + 1 个 v 头
        qkv_states = qkv_states.view(bsz, q_len, self.num_key_value_heads, self.num_key_value_groups + 2, self.head_dim)
        query_states = qkv_states[..., : self.num_key_value_groups, :]
        query_states = query_states.reshape(bsz, q_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = qkv_states[..., -2, :].transpose(1, 2)    # (B, 组数, L, head_dim)
        value_states = qkv_states[..., -1, :].transpose(1, 2)

        cos, sin = self._rope(q_len, hidden_states.dtype)
        query_states = query_states * cos + rotate_half(query_states) * sin
        key_states = key_states * cos + rotate_half(key_states) * sin

        # 每个 KV 头复制给它那一组的查询头：第 h 个查询头用第 h // n_rep 个 KV 头
        key_states = torch.repeat_interleave(key_states, self.num_key_value_groups, dim=1)
        value_states = torch.repeat_interleave(value_states, self.num_key_value_groups, dim=1)

        attn_weights = query_states @ key_states.transpose(2, 3) / math.sqrt(self.head_dim)
        # 因果掩码：第 i 个词只能看到第 0..i 个词
        causal = torch.ones(q_len, q_len, dtype=torch.bool, device=hidden_states.device).tril()
        attn_weights = attn_weights.masked_fill(~causal, float("-inf"))
        attn_weights = F.softmax(attn_weights, dim=-1)

        attn_output = (attn_weights @ value_states).transpose(1, 2).reshape(bsz, q_len, self.hidden_size)
        return self.wo(attn_output)
