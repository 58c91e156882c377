# Correct: a Phi-3-style layer: one qkv_proj whose rows are the queries, then fewer key/value heads
# (sliced apart by position), and RoPE on the first half of each head only (partial rotary, the
# GPT-NeoX pairing: feature i with i + R/2); the rest of each head passes unturned.
import torch
from torch import nn


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class PartialRotaryAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads=2, head_dim=8, partial_rotary_factor=0.5,
                 rope_theta=10000.0):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_attention_heads, num_key_value_heads, head_dim
        self.rotary_dim = int(self.head_dim * partial_rotary_factor)
        op_size = (num_attention_heads + 2 * num_key_value_heads) * self.head_dim
        self.qkv_proj = nn.Linear(hidden_size, op_size, bias=False)
        self.o_proj = nn.Linear(num_attention_heads * self.head_dim, hidden_size, bias=False)
        inv_freq = 1.0 / rope_theta ** (torch.arange(0, self.rotary_dim, 2).float() / self.rotary_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, hidden_states):
        bsz, q_len, _ = hidden_states.shape
        qkv = self.qkv_proj(hidden_states)
        query_pos = self.num_heads * self.head_dim
        kv_pos = query_pos + self.num_kv_heads * self.head_dim
        q = qkv[..., :query_pos].view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        k = qkv[..., query_pos:kv_pos].view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        v = qkv[..., kv_pos:].view(bsz, q_len, -1, self.head_dim).transpose(1, 2)
        freqs = torch.outer(torch.arange(q_len, dtype=torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos().to(q.dtype), emb.sin().to(q.dtype)
        q_rot, q_pass = q[..., :self.rotary_dim], q[..., self.rotary_dim:]
        k_rot, k_pass = k[..., :self.rotary_dim], k[..., self.rotary_dim:]
        q = torch.cat(((q_rot * cos) + (rotate_half(q_rot) * sin), q_pass), dim=-1)
        k = torch.cat(((k_rot * cos) + (rotate_half(k_rot) * sin), k_pass), dim=-1)
        groups = self.num_heads // self.num_kv_heads
        k = k[:, :, None].expand(-1, -1, groups, -1, -1).reshape(bsz, self.num_heads, q_len, self.head_dim)
        v = v[:, :, None].expand(-1, -1, groups, -1, -1).reshape(bsz, self.num_heads, q_len, self.head_dim)
        scores = torch.matmul(q, k.transpose(2, 3)) * self.head_dim ** -0.5
        causal = torch.full((q_len, q_len), float("-inf"), dtype=scores.dtype).triu(1)
        weights = torch.softmax(scores + causal, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(weights, v).transpose(1, 2).reshape(bsz, q_len, -1)
        return self.o_proj(out)
