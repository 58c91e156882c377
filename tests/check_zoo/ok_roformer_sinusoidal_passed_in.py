"""RoFormer-style self-attention (ZhuiyiTechnology/roformer, transformers' modeling_roformer): the model passes in
sinusoidal position embeddings (1, 1, L, D) = [sin | cos]; q and k are turned by them in interleaved pairs."""

import math

import torch
from torch import nn


class RoFormerSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.h, self.d = num_attention_heads, hidden_size // num_attention_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)
        self.out = nn.Linear(hidden_size, hidden_size)

    @staticmethod
    def apply_rotary_position_embeddings(sinusoidal_pos, query_layer, key_layer):
        sin, cos = sinusoidal_pos.chunk(2, dim=-1)
        sin_pos = torch.stack([sin, sin], dim=-1).reshape_as(sinusoidal_pos)
        cos_pos = torch.stack([cos, cos], dim=-1).reshape_as(sinusoidal_pos)
        rotate_q = torch.stack([-query_layer[..., 1::2], query_layer[..., ::2]], dim=-1).reshape_as(query_layer)
        rotate_k = torch.stack([-key_layer[..., 1::2], key_layer[..., ::2]], dim=-1).reshape_as(key_layer)
        return query_layer * cos_pos + rotate_q * sin_pos, key_layer * cos_pos + rotate_k * sin_pos

    def forward(self, hidden_states, sinusoidal_pos):
        b, t, _ = hidden_states.shape
        q, k, v = (layer(hidden_states).view(b, t, self.h, self.d).permute(0, 2, 1, 3)
                   for layer in (self.query, self.key, self.value))
        q, k = self.apply_rotary_position_embeddings(sinusoidal_pos, q, k)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d)
        probs = nn.functional.softmax(scores, dim=-1)
        context = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous().view(b, t, -1)
        return self.out(context)
