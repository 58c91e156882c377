"""仿 MiniMind 的注意力层（中文注释）：GQA + RoPE + QK-Norm + KV cache。
- q_norm / k_norm：对每个头的 q、k 在 head_dim 上做带权重的 RMSNorm，放在 RoPE 之前；
- attention_mask：形状 (batch, 总长度)，1 表示真实的词，0 表示填充；
- past_key_value / use_cache：推理时把之前的 k、v 拼在前面，返回 (输出, 新的缓存)。"""
import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self.weight * self._norm(x)


def precompute_freqs_cis(dim: int, end: int = 32 * 1024, rope_base: float = 1e6):
    """预先算好每个位置的 cos、sin，形状 (end, dim)，前后两半相同（配合 rotate_half 使用）"""
    freqs = 1.0 / (rope_base ** (torch.arange(0, dim, 2, dtype=torch.float64)[: (dim // 2)] / dim))
    t = torch.arange(end, dtype=torch.float64)
    freqs = torch.outer(t, freqs)
    freqs_cos = torch.cat([torch.cos(freqs), torch.cos(freqs)], dim=-1)
    freqs_sin = torch.cat([torch.sin(freqs), torch.sin(freqs)], dim=-1)
    return freqs_cos, freqs_sin


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    def rotate_half(x):
        return torch.cat((-x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), dim=-1)

    q_embed = (q * cos.unsqueeze(unsqueeze_dim)) + (rotate_half(q) * sin.unsqueeze(unsqueeze_dim))
    k_embed = (k * cos.unsqueeze(unsqueeze_dim)) + (rotate_half(k) * sin.unsqueeze(unsqueeze_dim))
    return q_embed, k_embed


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(bs, slen, kv 头数, head_dim) -> (bs, slen, kv 头数 * n_rep, head_dim)，相邻的查询头共用一个 kv 头"""
    bs, slen, num_key_value_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (x[:, :, :, None, :].expand(bs, slen, num_key_value_heads, n_rep, head_dim)
            .reshape(bs, slen, num_key_value_heads * n_rep, head_dim))


class Attention(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.num_key_value_heads = args.num_attention_heads if args.num_key_value_heads is None else args.num_key_value_heads
        assert args.num_attention_heads % self.num_key_value_heads == 0
        self.n_local_heads = args.num_attention_heads
        self.n_local_kv_heads = self.num_key_value_heads
        self.n_rep = self.n_local_heads // self.n_local_kv_heads
        self.head_dim = args.hidden_size // args.num_attention_heads
        self.q_proj = nn.Linear(args.hidden_size, args.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(args.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(args.hidden_size, self.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(args.num_attention_heads * self.head_dim, args.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.head_dim, eps=args.rms_norm_eps)
        self.k_norm = RMSNorm(self.head_dim, eps=args.rms_norm_eps)
        freqs_cos, freqs_sin = precompute_freqs_cis(self.head_dim, args.max_position_embeddings, args.rope_theta)
        self.register_buffer("freqs_cos", freqs_cos, persistent=False)
        self.register_buffer("freqs_sin", freqs_sin, persistent=False)

    def forward(self, x, past_key_value=None, use_cache=False, attention_mask=None):
        bsz, seq_len, _ = x.shape
        xq = self.q_proj(x).view(bsz, seq_len, self.n_local_heads, self.head_dim)
        xk = self.k_proj(x).view(bsz, seq_len, self.n_local_kv_heads, self.head_dim)
        xv = self.v_proj(x).view(bsz, seq_len, self.n_local_kv_heads, self.head_dim)

        # QK-Norm：在 RoPE 之前，对每个头单独归一化
        xq, xk = self.q_norm(xq), self.k_norm(xk)

        # 有缓存时，新词的位置从缓存长度开始数
        start = past_key_value[0].shape[1] if past_key_value is not None else 0
        cos = self.freqs_cos[start:start + seq_len].to(x.dtype)
        sin = self.freqs_sin[start:start + seq_len].to(x.dtype)
        xq, xk = apply_rotary_pos_emb(xq, xk, cos, sin, unsqueeze_dim=1)

        # kv cache：沿序列维把旧的 k、v 拼在前面
        if past_key_value is not None:
            xk = torch.cat([past_key_value[0], xk], dim=1)
            xv = torch.cat([past_key_value[1], xv], dim=1)
        past_kv = (xk, xv) if use_cache else None

        xq = xq.transpose(1, 2)                           # (bsz, 头数, seq_len, head_dim)
        xk = repeat_kv(xk, self.n_rep).transpose(1, 2)    # (bsz, 头数, 总长度, head_dim)
        xv = repeat_kv(xv, self.n_rep).transpose(1, 2)

        scores = (xq @ xk.transpose(-2, -1)) / math.sqrt(self.head_dim)
        # 因果掩码只加在最后 seq_len 列上：新词可以看到全部旧词
        scores[:, :, :, -seq_len:] += torch.triu(
            torch.full((seq_len, seq_len), float("-inf"), device=scores.device), diagonal=1)

        if attention_mask is not None:
            # 1 = 真实的词，0 = 填充；把填充位置加上一个很大的负数
            extended_attention_mask = attention_mask.unsqueeze(1).unsqueeze(2)
            extended_attention_mask = (1.0 - extended_attention_mask) * -1e9
            scores = scores + extended_attention_mask

        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        output = (scores @ xv).transpose(1, 2).reshape(bsz, seq_len, -1)
        output = self.o_proj(output)
        return output, past_kv
