"""Causal self-attention with the weights kept as raw parameters: one (d_model, d_head) matrix per head
for queries, keys and values, one (d_head, d_model) per head for the output, and every product an einsum.
Shapes: batch b, positions p/q/k, heads n, head size h, model width m."""
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Config:
    d_model: int = 768
    n_heads: int = 12
    d_head: int = 64
    n_ctx: int = 1024
    init_range: float = 0.02


class Attention(nn.Module):
    IGNORE: torch.Tensor

    def __init__(self, cfg: Config):
        super().__init__()
        self.cfg = cfg
        self.W_Q = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_K = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_V = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_model, cfg.d_head)))
        self.W_O = nn.Parameter(torch.empty((cfg.n_heads, cfg.d_head, cfg.d_model)))
        self.b_Q = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_K = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_V = nn.Parameter(torch.zeros((cfg.n_heads, cfg.d_head)))
        self.b_O = nn.Parameter(torch.zeros((cfg.d_model)))
        for weight in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(weight, std=cfg.init_range)
        self.register_buffer("IGNORE", torch.tensor(-1e5), persistent=False)

    def forward(self, normalized_resid_pre: torch.Tensor) -> torch.Tensor:
        x = normalized_resid_pre  # (b, p, m)
        q = torch.einsum("bpm,nmh->bpnh", x, self.W_Q) + self.b_Q
        k = torch.einsum("bpm,nmh->bpnh", x, self.W_K) + self.b_K
        v = torch.einsum("bpm,nmh->bpnh", x, self.W_V) + self.b_V

        attn_scores = torch.einsum("bqnh,bknh->bnqk", q, k) / self.cfg.d_head ** 0.5
        attn_scores = self.apply_causal_mask(attn_scores)
        pattern = attn_scores.softmax(dim=-2)  # (b, n, q, k)

        z = torch.einsum("bnqk,bknh->bqnh", pattern, v)
        return torch.einsum("bqnh,nhm->bqm", z, self.W_O) + self.b_O

    def apply_causal_mask(self, attn_scores: torch.Tensor) -> torch.Tensor:
        """Each query sees itself and the keys before it."""
        q_len, k_len = attn_scores.shape[-2:]
        future = torch.triu(torch.ones(q_len, k_len, dtype=torch.bool, device=attn_scores.device), diagonal=1)
        return attn_scores.masked_fill(future, self.IGNORE)
