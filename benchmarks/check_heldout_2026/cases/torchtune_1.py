"""Attention in the layout of torchtune's MultiHeadAttention: q_proj / k_proj / v_proj / output_proj, a
pos_embeddings module (rotary on neighbouring pairs, cache of (cos, sin) stacked on the last axis) applied on
(b, s, n_h, h_d), key/value heads expanded per group, and forward(x, y=None, *, mask=None) where mask
(b, s_x, s_y) is True where a query may attend; without a mask the layer is causal."""
import torch
import torch.nn.functional as F
from torch import nn


class RotaryPositionalEmbeddings(nn.Module):
    def __init__(self, dim, max_seq_len=4096, base=10_000):
        super().__init__()
        theta = 1.0 / (base ** (torch.arange(0, dim, 2)[: dim // 2].double() / dim))
        seq_idx = torch.arange(max_seq_len, dtype=theta.dtype)
        idx_theta = torch.einsum("i, j -> ij", seq_idx, theta)
        self.register_buffer("cache", torch.stack([idx_theta.cos(), idx_theta.sin()], dim=-1), persistent=False)

    def forward(self, x):
        # x: (b, s, n_h, h_d)
        seq_len = x.size(1)
        rope_cache = self.cache[:seq_len].to(x.dtype)
        xshaped = x.reshape(*x.shape[:-1], -1, 2)
        rope_cache = rope_cache.view(1, seq_len, 1, xshaped.size(3), 2)
        x_out = torch.stack(
            [
                xshaped[..., 0] * rope_cache[..., 0] - xshaped[..., 1] * rope_cache[..., 1],
                xshaped[..., 1] * rope_cache[..., 0] + xshaped[..., 0] * rope_cache[..., 1],
            ],
            -1,
        )
        return x_out.flatten(3)


class MultiHeadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, num_kv_heads, head_dim, max_seq_len=4096, is_causal=True):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.is_causal = is_causal
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False)
        self.output_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=False)
        self.pos_embeddings = RotaryPositionalEmbeddings(head_dim, max_seq_len)

    def forward(self, x, y=None, *, mask=None):
        b, s_x, _ = x.shape
        y = x if y is None else y
        s_y = y.shape[1]
        q_per_kv = self.num_heads // self.num_kv_heads

        q = self.q_proj(x).view(b, s_x, self.num_kv_heads * q_per_kv, self.head_dim)
        q = self.pos_embeddings(q).transpose(1, 2)

        k = self.k_proj(y).view(b, s_y, -1, self.head_dim)
        v = self.v_proj(y).view(b, s_y, -1, self.head_dim)
        k = self.pos_embeddings(k)
        k, v = k.transpose(1, 2), v.transpose(1, 2)

        if self.num_heads != self.num_kv_heads:
            expand_shape = (b, self.num_kv_heads, q_per_kv, -1, self.head_dim)
            k = k.unsqueeze(2).expand(expand_shape).flatten(1, 2)
            v = v.unsqueeze(2).expand(expand_shape).flatten(1, 2)

        if mask is not None:
            mask = mask[:, None, :, :]
        output = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=self.is_causal and mask is None
        )
        output = output.transpose(1, 2).contiguous().view(b, s_x, -1)
        return self.output_proj(output)
