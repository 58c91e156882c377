"""参考百灵（Ling / Bailing）模型的注意力层手写的版本。

- query_key_value 是一个融合线性层，输出依次是：所有 query 头、所有 key 头、所有 value 头（KV 头更少，GQA）；
- 每个头的 q、k 先做 RMSNorm（query_layernorm / key_layernorm），再加旋转位置编码；
- 旋转位置编码只作用在每个头前 partial_rotary_factor 比例的维度上；
- 最后交给 PyTorch 的 SDPA 做因果注意力，dense 是输出投影。
"""
import torch
import torch.nn.functional as F
from torch import nn


class BailingRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class BailingAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // self.num_heads
        self.rotary_dim = int(self.head_dim * config.partial_rotary_factor)
        self.rope_theta = config.rope_theta
        out_size = (self.num_heads + 2 * self.num_kv_heads) * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, out_size, bias=config.use_qkv_bias)
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.query_layernorm = BailingRMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.key_layernorm = BailingRMSNorm(self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states)
        qkv = qkv.view(bsz, q_len, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        q, k, v = qkv.split([self.num_heads, self.num_kv_heads, self.num_kv_heads], dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (bsz, 头数, 长度, head_dim)

        q = self.query_layernorm(q)
        k = self.key_layernorm(k)

        # 只转前 rotary_dim 维，其余维度原样拼回去
        r = self.rotary_dim
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, r, 2, dtype=torch.float64) / r))
        freqs = torch.outer(torch.arange(q_len, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        q_rot, q_pass = q[..., :r], q[..., r:]
        k_rot, k_pass = k[..., :r], k[..., r:]
        q = torch.cat((q_rot * cos + rotate_half(q_rot) * sin, q_pass), dim=-1)
        k = torch.cat((k_rot * cos + rotate_half(k_rot) * sin, k_pass), dim=-1)

        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).reshape(bsz, q_len, -1)
        return self.dense(out)
