"""手写带 KV Cache 的解码器注意力（推理加速教程里的写法）。

- forward(x, attention_mask=None, past_key_value=None, use_cache=False)；
- past_key_value 是上一次返回的 (k, v)，新算出的 k、v 拼在它后面；
- 旋转位置编码的位置要从缓存长度 start 开始算，不能每次都从 0 开始；
- 预填充（一次输入整段 prompt、没有缓存）时直接用 SDPA 的 is_causal=True；
  之后的每一步用“右下角对齐”的因果掩码：新 token 能看到缓存里所有的 key。
"""
import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class CachedAttention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, rope_base=10000.0):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_kv_heads
        self.head_dim = dim // n_heads
        self.rope_base = rope_base
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def rope(self, start, length, dtype):
        # 位置 start, start+1, ..., start+length-1
        inv_freq = 1.0 / (self.rope_base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        pos = torch.arange(start, start + length, dtype=torch.float64)
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, x, attention_mask=None, past_key_value=None, use_cache=False):
        b, t, _ = x.shape
        start = 0 if past_key_value is None else past_key_value[0].shape[2]  # 缓存里已有多少个位置

        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)

        cos, sin = self.rope(start, t, q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        if past_key_value is not None:
            k = torch.cat([past_key_value[0], k], dim=2)
            v = torch.cat([past_key_value[1], v], dim=2)
        present = (k, v) if use_cache else None

        rep = self.n_heads // self.n_kv_heads
        k_all = k.repeat_interleave(rep, dim=1)
        v_all = v.repeat_interleave(rep, dim=1)

        if attention_mask is None and start == 0:
            out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)
        else:
            # 右下角对齐：第 i 个新 token 能看到前 start + i + 1 个 key
            keep = torch.ones(t, start + t, dtype=torch.bool, device=x.device).tril(diagonal=start)
            if attention_mask is not None:
                keep = keep & attention_mask[:, None, None, :].bool()  # 1 = 真实 token
            out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=keep)

        out = out.transpose(1, 2).reshape(b, t, -1)
        out = self.wo(out)
        if use_cache:
            return out, present
        return out
