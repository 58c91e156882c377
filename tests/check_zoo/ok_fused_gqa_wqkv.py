# Correct: grouped-query attention with one fused projection, as in gpt-fast: wqkv holds the query
# rows (n_head * head_dim) and then the key and value rows (n_local_heads * head_dim each), cut apart by
# split with uneven sizes; each key/value head serves its group of query heads.
import torch
import torch.nn.functional as F
from torch import nn


class FusedGQA(nn.Module):
    def __init__(self, dim, n_head, n_local_heads=2):
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim = n_head, n_local_heads, dim // n_head
        total_head_dim = (n_head + 2 * n_local_heads) * self.head_dim
        self.wqkv = nn.Linear(dim, total_head_dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        bsz, seqlen, _ = x.shape
        kv_size = self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([self.n_head * self.head_dim, kv_size, kv_size], dim=-1)
        q = q.view(bsz, seqlen, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim).transpose(1, 2)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim).transpose(1, 2)
        k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).contiguous().view(bsz, seqlen, -1))
