"""GPT-NeoX-style attention: a fused query_key_value layer laid out per head as [q | k | v], rotary
embeddings on the first rotary_pct of each head's features only (the rest pass through), a causal
buffer, and masked scores filled with the dtype's minimum."""
import torch
from torch import nn


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class NeoXAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.hidden_size = config.hidden_size
        self.head_size = self.hidden_size // self.num_attention_heads
        self.rotary_ndims = int(self.head_size * config.rotary_pct)
        self.rotary_emb_base = getattr(config, "rotary_emb_base", 10000)
        max_positions = getattr(config, "max_position_embeddings", 2048)
        self.register_buffer("bias", torch.tril(torch.ones((max_positions, max_positions), dtype=torch.bool))
                             .view(1, 1, max_positions, max_positions), persistent=False)
        self.norm_factor = self.head_size ** -0.5
        self.query_key_value = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def rotary(self, seq_len, dtype):
        inv_freq = 1.0 / (self.rotary_emb_base ** (torch.arange(0, self.rotary_ndims, 2, dtype=torch.float64) / self.rotary_ndims))
        freqs = torch.outer(torch.arange(seq_len, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype), emb.sin().to(dtype)

    def forward(self, hidden_states):
        batch, seq_len, _ = hidden_states.shape
        qkv = self.query_key_value(hidden_states)
        # [batch, seq_len, (num_heads * 3 * head_size)] -> [batch, seq_len, num_heads, 3 * head_size]
        qkv = qkv.view(batch, seq_len, self.num_attention_heads, 3 * self.head_size)
        query = qkv[..., : self.head_size].permute(0, 2, 1, 3)
        key = qkv[..., self.head_size: 2 * self.head_size].permute(0, 2, 1, 3)
        value = qkv[..., 2 * self.head_size:].permute(0, 2, 1, 3)

        # rotary on the first rotary_ndims features of each head only
        query_rot, query_pass = query[..., : self.rotary_ndims], query[..., self.rotary_ndims:]
        key_rot, key_pass = key[..., : self.rotary_ndims], key[..., self.rotary_ndims:]
        cos, sin = self.rotary(seq_len, hidden_states.dtype)
        query_rot = query_rot * cos + rotate_half(query_rot) * sin
        key_rot = key_rot * cos + rotate_half(key_rot) * sin
        query = torch.cat((query_rot, query_pass), dim=-1)
        key = torch.cat((key_rot, key_pass), dim=-1)

        attn_scores = torch.matmul(query, key.transpose(-1, -2)) * self.norm_factor
        causal_mask = self.bias[:, :, :seq_len, :seq_len]
        attn_scores = torch.where(causal_mask, attn_scores, torch.finfo(attn_scores.dtype).min)
        attn_weights = nn.functional.softmax(attn_scores, dim=-1)
        attn_output = torch.matmul(attn_weights, value)

        attn_output = attn_output.permute(0, 2, 1, 3).reshape(batch, seq_len, self.hidden_size)
        return self.dense(attn_output)
