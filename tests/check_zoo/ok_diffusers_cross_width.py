"""diffusers-style cross-attention (huggingface/diffusers, models/attention_processor.py): ``to_k`` and ``to_v``
read encoder states of their own width (cross_attention_dim = 12) for queries of width 16."""

import torch
import torch.nn.functional as F
from torch import nn


class CrossAttnProcessorStyle(nn.Module):
    def __init__(self, query_dim=16, cross_attention_dim=12, heads=4, dim_head=4):
        super().__init__()
        inner = heads * dim_head
        self.heads = heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_k = nn.Linear(cross_attention_dim, inner, bias=False)
        self.to_v = nn.Linear(cross_attention_dim, inner, bias=False)
        self.to_out = nn.ModuleList([nn.Linear(inner, query_dim), nn.Dropout(0.0)])

    def forward(self, hidden_states, encoder_hidden_states=None):
        if encoder_hidden_states is None:
            encoder_hidden_states = hidden_states
        b = hidden_states.shape[0]
        q = self.to_q(hidden_states)
        k = self.to_k(encoder_hidden_states)
        v = self.to_v(encoder_hidden_states)
        d = q.shape[-1] // self.heads
        q, k, v = (t.view(b, -1, self.heads, d).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v)
        out = out.transpose(1, 2).reshape(b, -1, self.heads * d)
        for layer in self.to_out:
            out = layer(out)
        return out
