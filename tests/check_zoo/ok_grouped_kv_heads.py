# Correct: grouped-query attention as in Llama-style code: 4 query heads share 2 key/value heads
# (n_kv_heads), each kv head repeated for its group of query heads; no biases.
import torch
import torch.nn.functional as F
from torch import nn


class GroupedQueryAttention(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads=2):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_kv_heads, self.head_dim)
        group = self.n_heads // self.n_kv_heads
        keys = torch.repeat_interleave(xk, group, dim=2)  # (B, L, H, D): kv head j serves query heads j*group..
        values = torch.repeat_interleave(xv, group, dim=2)
        q, k, v = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        scores = torch.matmul(q, k.transpose(2, 3)) / self.head_dim ** 0.5
        out = torch.matmul(F.softmax(scores.float(), dim=-1).type_as(q), v)
        return self.wo(out.transpose(1, 2).contiguous().view(bsz, seqlen, -1))
