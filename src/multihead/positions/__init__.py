"""Positions for decoders: RoPE (rotary embeddings of q and k) and ALiBi slopes (a per-head distance bias).

    rope = RoPE(head_dim=64)                       # GPT-NeoX / Llama layout; interleaved=True for GPT-J
    q, k = rope(q, k, positions)                   # q (B, H, L, D), k (B, Hkv, L, D), positions (L,) or (B, L)
    cos, sin = rope.cos_sin(positions, q.dtype)    # (B or 1, L, R), for apply_rotary(x, cos, sin, interleaved)
    slopes = alibi_slopes(12)                      # (H,), any head count
    q = QueryTemperature(8192, 0.1)(q, positions)  # queries sharpened with their position (Llama 4 NoPE)

One concept per file: `rotary` (the two layouts and the turn itself), `rope_scaling` (frequencies and
HF's scaling kinds), `rope` (the module), `alibi` (the slopes), `temperature` (position-scaled queries).
"""
from multihead.positions.alibi import alibi_slopes
from multihead.positions.rope import RoPE
from multihead.positions.rotary import apply_rotary
from multihead.positions.temperature import QueryTemperature

__all__ = ["QueryTemperature", "RoPE", "alibi_slopes", "apply_rotary"]
