"""Sliding-window causal attention on FlexAttention: the pattern is a mask_mod (query may see key when
0 <= q_idx - kv_idx < window), turned into a block mask with create_block_mask, as the attention-gym
examples and recent training codebases write it."""
import torch
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


class SlidingWindowSelfAttention(nn.Module):
    def __init__(self, dim, n_heads, window_size):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.window_size = window_size
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        window = self.window_size

        def sliding_window_causal(b, h, q_idx, kv_idx):
            causal = q_idx >= kv_idx
            near = q_idx - kv_idx < window
            return causal & near

        block_mask = create_block_mask(sliding_window_causal, B=None, H=None, Q_LEN=T, KV_LEN=T, device=x.device)
        y = flex_attention(q, k, v, block_mask=block_mask)
        y = y.transpose(1, 2).reshape(B, T, C)
        return self.wo(y)
