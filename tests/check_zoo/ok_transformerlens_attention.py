"""Attention in the interpretability style of TransformerLens and the ARENA course: every projection is a raw
per-head parameter (W_Q, W_K, W_V of shape (n_heads, d_model, d_head), W_O of shape (n_heads, d_head,
d_model)) with a bias of its own, the einsums spell out batch, position and head, the scores are named
"batch n_heads query_pos key_pos", and the causal mask fills the future with a large negative IGNORE value."""

import torch
from torch import nn


class Attention(nn.Module):
    IGNORE: torch.Tensor

    def __init__(self, d_model, n_heads, init_range=0.02):
        super().__init__()
        d_head = d_model // n_heads
        self.d_head = d_head
        self.W_Q = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_K = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_V = nn.Parameter(torch.empty(n_heads, d_model, d_head))
        self.W_O = nn.Parameter(torch.empty(n_heads, d_head, d_model))
        self.b_Q = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_K = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_V = nn.Parameter(torch.zeros(n_heads, d_head))
        self.b_O = nn.Parameter(torch.zeros(d_model))
        for weight in (self.W_Q, self.W_K, self.W_V, self.W_O):
            nn.init.normal_(weight, std=init_range)
        self.register_buffer("IGNORE", torch.tensor(float(-1e5)))

    def apply_causal_mask(self, attn_scores):
        """attn_scores: (batch, n_heads, query_pos, key_pos)."""
        q_len, k_len = attn_scores.shape[-2:]
        future = torch.triu(torch.ones(q_len, k_len, device=attn_scores.device), diagonal=1).bool()
        return attn_scores.masked_fill_(future, self.IGNORE)

    def forward(self, normalized_resid_pre):
        q = torch.einsum("bpd,ndh->bpnh", normalized_resid_pre, self.W_Q) + self.b_Q
        k = torch.einsum("bpd,ndh->bpnh", normalized_resid_pre, self.W_K) + self.b_K
        v = torch.einsum("bpd,ndh->bpnh", normalized_resid_pre, self.W_V) + self.b_V
        attn_scores = torch.einsum("bqnh,bknh->bnqk", q, k) / self.d_head ** 0.5
        attn_scores = self.apply_causal_mask(attn_scores)
        attn_pattern = attn_scores.softmax(-1)  # (batch, n_heads, query_pos, key_pos)
        z = torch.einsum("bnqk,bknh->bqnh", attn_pattern, v)
        return torch.einsum("bqnh,nhd->bqd", z, self.W_O) + self.b_O
