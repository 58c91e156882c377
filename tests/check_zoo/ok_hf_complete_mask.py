"""A decoder layer in the Hugging Face style: the model builds one 4-D additive mask (B, 1, Lq, Lk), 0 where a
query may attend and a large negative number elsewhere, causal part included, and every layer adds it to its
scores. Called without one, the layer masks the future itself."""

import torch
from torch import nn


def eager_attention_forward(query, key, value, attention_mask, scaling):
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        causal_mask = attention_mask[:, :, :, : key.shape[-2]]
        attn_weights = attn_weights + causal_mask
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
    attn_output = torch.matmul(attn_weights, value)
    return attn_output.transpose(1, 2).contiguous()


class DecoderSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_heads = num_attention_heads
        self.head_dim = hidden_size // num_attention_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.k_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.v_proj = nn.Linear(hidden_size, hidden_size, bias=False)
        self.o_proj = nn.Linear(hidden_size, hidden_size, bias=False)

    def forward(self, hidden_states, attention_mask=None):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key_states = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        if attention_mask is None:  # no mask from the model: this layer's own causal mask
            length = hidden_states.shape[1]
            future = torch.ones(length, length, dtype=torch.bool, device=hidden_states.device).triu(1)
            attention_mask = torch.zeros(length, length, dtype=query_states.dtype).masked_fill(
                future, torch.finfo(query_states.dtype).min)[None, None]
        attn_output = eager_attention_forward(query_states, key_states, value_states, attention_mask, self.scaling)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output)
