# Correct: a learner's MLA whose file picks the absorbed form by default (attn_mode = "absorb"): each head's
# key rows of kv_up are folded into its query, the scores are taken on the latents plus a shared rotary key,
# and the value rows are applied after the weighted sum. RoPE is the half-split kind (rotate_half); the model
# hands every layer the start position and the cos and sin tables (L, rope_dim) as two arguments. Causal.
import math

import torch
from torch import nn

attn_mode = "absorb"  # "naive" decompresses keys and values per head


def rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class LatentSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, kv_rank=8, nope_dim=8, rope_dim=4, v_dim=6):
        super().__init__()
        self.h, self.nope, self.rope, self.vd, self.rank = n_heads, nope_dim, rope_dim, v_dim, kv_rank
        self.q_proj = nn.Linear(d_model, n_heads * (nope_dim + rope_dim), bias=False)
        self.kv_down = nn.Linear(d_model, kv_rank + rope_dim, bias=False)
        self.kv_norm = nn.RMSNorm(kv_rank, eps=1e-6)
        self.kv_up = nn.Linear(kv_rank, n_heads * (nope_dim + v_dim), bias=False)
        self.o_proj = nn.Linear(n_heads * v_dim, d_model, bias=False)

    @staticmethod
    def _turn(x, cos, sin):
        return x * cos.to(x.dtype) + rotate_half(x) * sin.to(x.dtype)

    def forward(self, x, start_pos, cos, sin):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.h, self.nope + self.rope).transpose(1, 2)  # (b, h, t, nope + rope)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)
        latent, k_rot = self.kv_down(x).split([self.rank, self.rope], dim=-1)
        latent = self.kv_norm(latent)  # (b, t, rank)
        q_rot = self._turn(q_rot, cos, sin)
        k_rot = self._turn(k_rot, cos, sin)  # (b, t, rope): one rotary key shared by the heads
        scale = 1.0 / math.sqrt(self.nope + self.rope)
        up = self.kv_up.weight.view(self.h, self.nope + self.vd, self.rank)
        if attn_mode == "naive":
            kv = self.kv_up(latent).view(b, t, self.h, self.nope + self.vd).transpose(1, 2)
            k_nope, v = kv.split([self.nope, self.vd], dim=-1)
            scores = q_nope @ k_nope.transpose(-2, -1) + q_rot @ k_rot.unsqueeze(1).transpose(-2, -1)
        else:
            q_latent = torch.einsum("bhtd,hdc->bhtc", q_nope, up[:, :self.nope])
            scores = q_latent @ latent.unsqueeze(1).transpose(-2, -1) + q_rot @ k_rot.unsqueeze(1).transpose(-2, -1)
        scores = scores * scale
        future = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
        if attn_mode == "naive":
            out = weights @ v
        else:
            out = torch.einsum("bhts,bsc,hdc->bhtd", weights, latent, up[:, self.nope:])
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.vd))
