# Buggy: a decoder's self-attention that builds its causal mask and then calls scaled_dot_product_attention
# without it (the attn_mask argument was forgotten): every token also sees the tokens after it.
import torch
import torch.nn.functional as F
from torch import nn


class DecoderSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)
        allowed = torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device))  # True = may attend
        y = F.scaled_dot_product_attention(q, k, v)
        return self.out(y.transpose(1, 2).reshape(b, t, c))
