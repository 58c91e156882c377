"""照着 ChatGLM2/3 的写法手写的自注意力层（中文教程里常见的那种）。

- 输入是“序列在前”的 (seq_len, batch, hidden)；
- 一个融合的 query_key_value 线性层：前面是所有 query 头，后面是 multi_query_group_num 组 key 和 value；
- 旋转位置编码只作用在每个头的前一半维度上，而且是相邻两个数一组（交错排列）；
- attention_mask 是布尔张量，True 表示“挡住，不许看”；不传掩码时按因果注意力处理。
"""
import torch
import torch.nn.functional as F
from torch import nn


def apply_rotary(x, cos, sin):
    # x: (序列, batch, 头数, head_dim)；cos/sin: (序列, rot_dim // 2)
    sq, b, np_, hn = x.shape
    rot_dim = cos.shape[-1] * 2
    x_rot, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    xs = x_rot.reshape(sq, b, np_, rot_dim // 2, 2)
    cos = cos.view(sq, 1, 1, rot_dim // 2)
    sin = sin.view(sq, 1, 1, rot_dim // 2)
    out = torch.stack((xs[..., 0] * cos - xs[..., 1] * sin,
                       xs[..., 1] * cos + xs[..., 0] * sin), dim=-1)
    return torch.cat((out.flatten(3), x_pass), dim=-1)


class SelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.hidden_size = config.hidden_size
        self.head_dim = config.kv_channels
        self.num_groups = config.multi_query_group_num
        # 融合投影的输出：所有 query 头 + 每组一个 key 头 + 每组一个 value 头
        qkv_size = self.num_heads * self.head_dim + 2 * self.num_groups * self.head_dim
        self.query_key_value = nn.Linear(config.hidden_size, qkv_size, bias=config.add_qkv_bias)
        self.dense = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)
        self.rot_dim = self.head_dim // 2  # 只旋转一半
        self.base = 10000.0

    def rope_cache(self, seq_len, dtype):
        theta = 1.0 / (self.base ** (torch.arange(0, self.rot_dim, 2, dtype=torch.float64) / self.rot_dim))
        idx_theta = torch.outer(torch.arange(seq_len, dtype=torch.float64), theta)
        return torch.cos(idx_theta).to(dtype), torch.sin(idx_theta).to(dtype)

    def forward(self, hidden_states, attention_mask=None):
        sq, b, _ = hidden_states.shape
        mixed = self.query_key_value(hidden_states)
        q, k, v = mixed.split([self.num_heads * self.head_dim,
                               self.num_groups * self.head_dim,
                               self.num_groups * self.head_dim], dim=-1)
        q = q.view(sq, b, self.num_heads, self.head_dim)
        k = k.view(sq, b, self.num_groups, self.head_dim)
        v = v.view(sq, b, self.num_groups, self.head_dim)

        cos, sin = self.rope_cache(sq, q.dtype)
        q = apply_rotary(q, cos, sin)
        k = apply_rotary(k, cos, sin)

        # 多查询分组：每组的 key/value 复制给本组的几个 query 头
        per_group = self.num_heads // self.num_groups
        k = k.unsqueeze(-2).expand(sq, b, self.num_groups, per_group, self.head_dim)
        k = k.reshape(sq, b, self.num_heads, self.head_dim)
        v = v.unsqueeze(-2).expand(sq, b, self.num_groups, per_group, self.head_dim)
        v = v.reshape(sq, b, self.num_heads, self.head_dim)

        # (序列, batch, 头, 维) -> (batch, 头, 序列, 维)
        q, k, v = [t.permute(1, 2, 0, 3) for t in (q, k, v)]
        if attention_mask is None:
            ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            # 我们的掩码 True = 挡住；SDPA 的布尔掩码 True = 可以看，所以取反
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=~attention_mask)
        ctx = ctx.permute(2, 0, 1, 3).reshape(sq, b, self.num_heads * self.head_dim)
        return self.dense(ctx)
