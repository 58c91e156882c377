"""The dict-cache decoder of 2025 tutorials with SDPA's ``is_causal=True`` on every call: in a decoding step the lone
new query is aligned top-left with the cached keys, so it sees only key 0 (SDPA's is_causal masks as tril of
(Lq, Lk) from the top-left corner)."""

import torch
import torch.nn.functional as F
from torch import nn


class StepCausalAttention(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, d_model // n_heads
        self.wq = nn.Linear(d_model, d_model, bias=False)
        self.wk = nn.Linear(d_model, d_model, bias=False)
        self.wv = nn.Linear(d_model, d_model, bias=False)
        self.wo = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x, attention_mask=None, cache=None):
        B, T, _ = x.shape
        q, k, v = (w(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        past = 0
        if cache is not None and "k" in cache:
            past = cache["k"].shape[2]
            k = torch.cat([cache["k"], k], dim=2)
            v = torch.cat([cache["v"], v], dim=2)
        if cache is not None:
            cache["k"], cache["v"] = k, v
        S = k.shape[2]
        if attention_mask is not None:
            causal = torch.ones(T, S, dtype=torch.bool, device=x.device).tril(past)
            keep = causal[None, None] & attention_mask[:, None, None, -S:].bool()
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
        else:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))
