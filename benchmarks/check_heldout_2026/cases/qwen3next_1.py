"""仿照 Qwen3-Next 的门控注意力（gated attention）写的一层。

q_proj 的输出宽度是平常的两倍：每个头先是自己的 query，后面紧跟同样宽的门控值 gate。
注意力算完之后，用 sigmoid(gate) 逐元素乘上每个头的输出，再送进 o_proj。
q、k 各自做 RMSNorm（权重存的是相对 1 的偏移，所以乘的是 1 + weight），只对每个头的前一部分维度做旋转位置编码。
"""
import torch
import torch.nn.functional as F
from torch import nn


class ZeroCenteredRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(dim))

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return x * (1.0 + self.weight)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class GatedAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        # 只旋转每个头的前 rotary_dim 个维度
        self.rotary_dim = int(self.head_dim * config.partial_rotary_factor)
        self.rope_theta = config.rope_theta
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim * 2, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.q_norm = ZeroCenteredRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = ZeroCenteredRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states):
        b, n, _ = hidden_states.shape
        # (b, n, 头数, 2 * head_dim)：每个头的 query 和门控挨在一起
        q_and_gate = self.q_proj(hidden_states).view(b, n, self.num_heads, 2 * self.head_dim)
        q, gate = torch.chunk(q_and_gate, 2, dim=-1)
        gate = gate.reshape(b, n, self.num_heads * self.head_dim)

        q = self.q_norm(q).transpose(1, 2)  # (b, 头数, n, head_dim)
        k = self.k_norm(self.k_proj(hidden_states).view(b, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(hidden_states).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)

        # 部分旋转：前 rotary_dim 维转，后面的维度原样保留
        r = self.rotary_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
        freqs = torch.arange(n, dtype=torch.float64)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        q = torch.cat((q[..., :r] * cos + rotate_half(q[..., :r]) * sin, q[..., r:]), dim=-1)
        k = torch.cat((k[..., :r] * cos + rotate_half(k[..., :r]) * sin, k[..., r:]), dim=-1)

        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).reshape(b, n, -1)
        # 输出门：先乘 sigmoid(gate)，再做输出投影
        out = out * torch.sigmoid(gate)
        return self.o_proj(out)
