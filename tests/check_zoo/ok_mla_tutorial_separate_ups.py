"""Multi-head latent attention as a from-scratch tutorial writes it (in the manner of the 2025 "MLA from scratch"
blog posts): a latent down-projection for keys and values, separate up-projections for keys and values, a
decoupled rotary key shared by every head, queries with a rotary part of their own; naive form only."""

import torch
import torch.nn.functional as F
from torch import nn


def rope_half(x):
    T, R = x.shape[-2], x.shape[-1]
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, R, 2, dtype=torch.float32) / R))
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    ang = torch.cat((ang, ang), dim=-1)
    x1, x2 = x[..., : R // 2], x[..., R // 2:]
    return x * ang.cos().to(x.dtype) + torch.cat((-x2, x1), dim=-1) * ang.sin().to(x.dtype)


class TutorialMLA(nn.Module):
    def __init__(self, d_model, n_heads, d_latent=8, d_nope=4, d_rope=4):
        super().__init__()
        self.n_heads, self.d_nope, self.d_rope = n_heads, d_nope, d_rope
        self.W_q = nn.Linear(d_model, n_heads * d_nope, bias=False)
        self.W_qr = nn.Linear(d_model, n_heads * d_rope, bias=False)
        self.W_dkv = nn.Linear(d_model, d_latent, bias=False)
        self.W_uk = nn.Linear(d_latent, n_heads * d_nope, bias=False)
        self.W_uv = nn.Linear(d_latent, n_heads * d_nope, bias=False)
        self.W_kr = nn.Linear(d_model, d_rope, bias=False)
        self.W_o = nn.Linear(n_heads * d_nope, d_model, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        H = self.n_heads
        c_kv = self.W_dkv(x)  # (B, T, d_latent): what a cache would keep
        q_c = self.W_q(x).view(B, T, H, self.d_nope).transpose(1, 2)
        q_r = rope_half(self.W_qr(x).view(B, T, H, self.d_rope).transpose(1, 2))
        k_c = self.W_uk(c_kv).view(B, T, H, self.d_nope).transpose(1, 2)
        k_r = rope_half(self.W_kr(x).unsqueeze(1)).expand(B, H, T, self.d_rope)
        v = self.W_uv(c_kv).view(B, T, H, self.d_nope).transpose(1, 2)
        q = torch.cat([q_c, q_r], dim=-1)
        k = torch.cat([k_c, k_r], dim=-1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.W_o(out.transpose(1, 2).reshape(B, T, -1))
