"""A course adapter in the style of Stanford CS336's first assignment: a plain function handed the model
width, the head count and every projection's weight (d_out, d_in), as the course's tests call it; causal
self-attention with all heads projected in one matrix multiply each. The RoPE version also takes the
context length, theta and each token's position."""

import math

import torch


def softmax(x, dim):
    shifted = x - x.max(dim=dim, keepdim=True).values
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


def scaled_dot_product_attention(Q, K, V, mask=None):
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return softmax(scores, dim=-1) @ V


def linear(x, weight):
    return torch.einsum("...i,oi->...o", x, weight)


def split_heads(t, num_heads):
    *lead, seq, width = t.shape
    return t.view(*lead, seq, num_heads, width // num_heads).transpose(-3, -2)


def merge_heads(t):
    *lead, heads, seq, d = t.shape
    return t.transpose(-3, -2).reshape(*lead, seq, heads * d)


def rope(x, positions, theta, max_seq_len):
    d = x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, dtype=torch.float32) / d)
    angles = torch.arange(max_seq_len, dtype=torch.float32)[:, None] * inv_freq  # (max_seq_len, d/2)
    cos, sin = angles.cos()[positions].to(x.dtype), angles.sin()[positions].to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    turned = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return turned.flatten(-2)


def run_multihead_self_attention(d_model, num_heads, q_proj_weight, k_proj_weight, v_proj_weight, o_proj_weight,
                                 in_features):
    seq_len = in_features.shape[-2]
    q = split_heads(linear(in_features, q_proj_weight), num_heads)
    k = split_heads(linear(in_features, k_proj_weight), num_heads)
    v = split_heads(linear(in_features, v_proj_weight), num_heads)
    causal = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=in_features.device))
    out = scaled_dot_product_attention(q, k, v, causal)
    return linear(merge_heads(out), o_proj_weight)


def run_multihead_self_attention_with_rope(d_model, num_heads, max_seq_len, theta, q_proj_weight, k_proj_weight,
                                           v_proj_weight, o_proj_weight, in_features, token_positions=None):
    seq_len = in_features.shape[-2]
    if token_positions is None:
        token_positions = torch.arange(seq_len, device=in_features.device)
    q = split_heads(linear(in_features, q_proj_weight), num_heads)
    k = split_heads(linear(in_features, k_proj_weight), num_heads)
    v = split_heads(linear(in_features, v_proj_weight), num_heads)
    positions = token_positions.unsqueeze(-2)  # one table for every head
    q, k = rope(q, positions, theta, max_seq_len), rope(k, positions, theta, max_seq_len)
    causal = torch.tril(torch.ones(seq_len, seq_len, dtype=torch.bool, device=in_features.device))
    out = scaled_dot_product_attention(q, k, v, causal)
    return linear(merge_heads(out), o_proj_weight)
