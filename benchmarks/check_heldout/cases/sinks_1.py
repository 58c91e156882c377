"""Attention with learned sinks, as in gpt-oss: each head has one extra logit that joins the softmax's
denominator but carries no value, so a head can put weight "nowhere". Grouped key/value heads, RoPE,
causal."""
import torch
import torch.nn.functional as F
from torch import nn


def _apply_rotary_emb(x, cos, sin):
    first_half, second_half = torch.chunk(x, 2, dim=-1)
    first_ = first_half * cos - second_half * sin
    second_ = second_half * cos + first_half * sin
    return torch.cat((first_, second_), dim=-1)


class GptOssAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim = config.head_dim
        self.num_attention_heads = config.num_attention_heads
        self.num_key_value_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_attention_heads // self.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.rope_theta = getattr(config, "rope_theta", 150000.0)
        self.q_proj = nn.Linear(config.hidden_size, self.num_attention_heads * self.head_dim, bias=True)
        self.k_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.v_proj = nn.Linear(config.hidden_size, self.num_key_value_heads * self.head_dim, bias=True)
        self.o_proj = nn.Linear(self.num_attention_heads * self.head_dim, config.hidden_size, bias=True)
        self.sinks = nn.Parameter(torch.zeros(self.num_attention_heads))

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        hidden_shape = (bsz, q_len, -1, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        inv_freq = 1.0 / (self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim))
        freqs = torch.outer(torch.arange(q_len, dtype=torch.float64), inv_freq)
        cos, sin = freqs.cos().to(query.dtype), freqs.sin().to(query.dtype)
        query, key = _apply_rotary_emb(query, cos, sin), _apply_rotary_emb(key, cos, sin)

        key = key.repeat_interleave(self.num_key_value_groups, dim=1)
        value = value.repeat_interleave(self.num_key_value_groups, dim=1)
        attn_weights = torch.matmul(query, key.transpose(2, 3)) * self.scaling
        causal = torch.triu(torch.ones(q_len, q_len, dtype=torch.bool, device=query.device), diagonal=1)
        attn_weights = attn_weights.masked_fill(causal, float("-inf"))

        sinks = self.sinks.reshape(1, -1, 1, 1).expand(bsz, -1, q_len, -1)  # (bsz, heads, q_len, 1)
        combined_logits = torch.cat([attn_weights, sinks], dim=-1)
        combined_logits = combined_logits - combined_logits.max(dim=-1, keepdim=True).values
        probs = F.softmax(combined_logits, dim=-1)
        scores = probs[..., :-1]  # drop the sink

        attn_output = torch.matmul(scores, value).transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(attn_output)
