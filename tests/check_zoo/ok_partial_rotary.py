"""GPT-NeoX's attention: one fused query_key_value Linear laid out per head, and rotary embeddings on only the
first rotary_pct of each head's features (the rest pass through unchanged)."""

import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class GPTNeoXAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, rotary_pct=0.5, rotary_emb_base=10000):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.head_size = hidden_size // num_attention_heads
        self.rotary_ndims = int(self.head_size * rotary_pct)
        inv_freq = 1.0 / (rotary_emb_base ** (torch.arange(0, self.rotary_ndims, 2).float() / self.rotary_ndims))
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self.query_key_value = nn.Linear(hidden_size, 3 * hidden_size)
        self.dense = nn.Linear(hidden_size, hidden_size)

    def forward(self, hidden_states):
        b, t, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states).view(b, t, self.num_attention_heads, 3 * self.head_size)
        qkv = qkv.permute(0, 2, 1, 3)
        query, key, value = qkv.chunk(3, dim=-1)
        freqs = torch.outer(torch.arange(t, device=hidden_states.device).float(), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(query.dtype), emb.sin().to(query.dtype)
        q_rot, q_pass = query[..., : self.rotary_ndims], query[..., self.rotary_ndims:]
        k_rot, k_pass = key[..., : self.rotary_ndims], key[..., self.rotary_ndims:]
        query = torch.cat((q_rot * cos + rotate_half(q_rot) * sin, q_pass), dim=-1)
        key = torch.cat((k_rot * cos + rotate_half(k_rot) * sin, k_pass), dim=-1)
        scores = torch.matmul(query, key.transpose(-1, -2)) / self.head_size ** 0.5
        causal = torch.ones(t, t, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~causal, torch.finfo(scores.dtype).min)
        attn = torch.softmax(scores, dim=-1)
        out = torch.matmul(attn, value).permute(0, 2, 1, 3).reshape(b, t, -1)
        return self.dense(out)
