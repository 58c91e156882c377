"""Encoder attention laid out as in ModernBERT: one Wqkv Linear viewed as (bs, L, 3, H, D), rotary
embeddings (rotate_half), and alternating global and local layers; a local layer (layer_id not a multiple of
global_attn_every_n_layers) lets each token see the tokens within local_attention // 2 positions on either
side, and uses its own rotary base. attention_mask is the tokenizer's (B, L), 1 = token."""
import torch
import torch.nn.functional as F
from torch import nn


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class ModernBertAttention(nn.Module):
    def __init__(self, config, layer_id=None):
        super().__init__()
        self.config = config
        self.layer_id = config.layer_id if layer_id is None else layer_id
        self.num_heads = config.num_attention_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.all_head_size = self.head_dim * self.num_heads
        self.Wqkv = nn.Linear(config.hidden_size, 3 * self.all_head_size, bias=config.attention_bias)
        self.Wo = nn.Linear(config.hidden_size, config.hidden_size, bias=config.attention_bias)
        if self.layer_id % config.global_attn_every_n_layers != 0:
            self.local_attention = (config.local_attention // 2, config.local_attention // 2)
            self.rope_theta = config.local_rope_theta
        else:
            self.local_attention = (-1, -1)
            self.rope_theta = config.global_rope_theta

    def forward(self, hidden_states, attention_mask=None):
        bs, seqlen, _ = hidden_states.shape
        qkv = self.Wqkv(hidden_states).view(bs, -1, 3, self.num_heads, self.head_dim)
        query, key, value = qkv.transpose(3, 1).unbind(dim=2)  # each (bs, H, L, D)

        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        freqs = torch.outer(torch.arange(seqlen, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(query.dtype), emb.sin().to(query.dtype)
        query = query * cos + rotate_half(query) * sin
        key = key * cos + rotate_half(key) * sin

        keep = torch.ones(bs, 1, seqlen, seqlen, dtype=torch.bool, device=hidden_states.device)
        if attention_mask is not None:
            keep = keep & attention_mask[:, None, None, :].bool()
        if self.local_attention != (-1, -1):
            rows = torch.arange(seqlen, device=hidden_states.device).unsqueeze(0)
            distance = torch.abs(rows - rows.T)
            keep = keep & (distance <= self.local_attention[0])
        attn_output = F.scaled_dot_product_attention(query, key, value, attn_mask=keep)
        attn_output = attn_output.transpose(1, 2).contiguous().view(bs, -1, self.all_head_size)
        return self.Wo(attn_output)
