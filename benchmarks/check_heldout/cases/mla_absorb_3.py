"""手撕 MLA（多头潜在注意力）：推理时的“矩阵吸收”写法。

- 键和值先压缩成一个低秩的潜向量 c_kv（wkv_a），再经过 kv_norm；
- 朴素写法：用 wkv_b 把 c_kv 还原成每个头的 k_nope 和 v；
- 吸收写法（absorb=True）：把 wkv_b 里键的那部分并进查询，直接拿查询和潜向量算分数，
  值的那部分放到加权求和之后再乘，这样缓存里只需要存潜向量；
- RoPE 只作用在额外的 qk_rope_head_dim 维上，所有头共用同一个旋转后的键。两种写法的输出应当完全相同。"""
import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class MLA(nn.Module):
    def __init__(self, dim, n_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
                 rope_theta=10000.0):
        super().__init__()
        self.n_heads = n_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.qk_head_dim = qk_nope_head_dim + qk_rope_head_dim
        self.rope_theta = rope_theta
        self.wq = nn.Linear(dim, n_heads * self.qk_head_dim, bias=False)
        self.wkv_a = nn.Linear(dim, kv_lora_rank + qk_rope_head_dim, bias=False)   # 下投影：压缩成潜向量
        self.kv_norm = RMSNorm(kv_lora_rank)
        self.wkv_b = nn.Linear(kv_lora_rank, n_heads * (qk_nope_head_dim + v_head_dim), bias=False)  # 上投影
        self.wo = nn.Linear(n_heads * v_head_dim, dim, bias=False)
        self.softmax_scale = self.qk_head_dim ** -0.5

    def forward(self, x, absorb=False):
        bsz, seqlen, _ = x.shape
        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.qk_rope_head_dim, 2, dtype=torch.float64)
                                              / self.qk_rope_head_dim))
        freqs = torch.outer(torch.arange(seqlen, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(x.dtype)[None, :, None, :], emb.sin().to(x.dtype)[None, :, None, :]

        q = self.wq(x).view(bsz, seqlen, self.n_heads, self.qk_head_dim)
        q_nope, q_pe = q.split([self.qk_nope_head_dim, self.qk_rope_head_dim], dim=-1)
        q_pe = q_pe * cos + rotate_half(q_pe) * sin

        kv, k_pe = self.wkv_a(x).split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
        k_pe = k_pe.unsqueeze(2)
        k_pe = (k_pe * cos + rotate_half(k_pe) * sin).squeeze(2)    # (bsz, seqlen, rope 维数)，所有头共用

        mask = torch.full((seqlen, seqlen), float("-inf"), device=x.device).triu(1)   # 因果掩码
        wkv_b = self.wkv_b.weight.view(self.n_heads, -1, self.kv_lora_rank)          # (头数, nope + v, 秩)
        if not absorb:
            # 朴素写法：先把潜向量还原成每个头的 k_nope 和 v
            kv = self.wkv_b(self.kv_norm(kv)).view(bsz, seqlen, self.n_heads, -1)
            k_nope, v = kv.split([self.qk_nope_head_dim, self.v_head_dim], dim=-1)
            scores = (torch.einsum("bshd,bthd->bsht", q_nope, k_nope)
                      + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) * self.softmax_scale
            probs = F.softmax(scores + mask[:, None, :], dim=-1)
            out = torch.einsum("bsht,bthd->bshd", probs, v)
        else:
            # 吸收写法：缓存里只存潜向量 kv 和 k_pe
            q_nope = torch.einsum("bshd,hdc->bshc", q_nope, wkv_b[:, : self.qk_nope_head_dim])
            scores = (torch.einsum("bshc,btc->bsht", q_nope, kv)
                      + torch.einsum("bshr,btr->bsht", q_pe, k_pe)) * self.softmax_scale
            probs = F.softmax(scores + mask[:, None, :], dim=-1)
            out = torch.einsum("bsht,btc->bshc", probs, kv)
            out = torch.einsum("bshc,hdc->bshd", out, wkv_b[:, -self.v_head_dim:])
        return self.wo(out.flatten(2))
