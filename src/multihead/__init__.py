"""multihead: multi-head attention for PyTorch, correct under every convention, fast, and able to
explain itself.

    import multihead as mh
    out = mh.attention(q, k, v, mh.Mask.key_padding(pad), causal=True)   # (B, H, L, D)
    attn = mh.MultiHeadAttention(embed_dim=64, num_heads=8)
    y = attn(x, mask=mh.Mask.lengths(valid_lens))
"""
from multihead import textbook
from multihead.attention import attention
from multihead.capture import capture_attention
from multihead.dispatch import Decision, dispatch
from multihead.errors import AttentionError
from multihead.masks import Mask
from multihead.module import MultiHeadAttention
from multihead.positions import RoPE, alibi_slopes
from multihead.checker import check  # noqa: E402  (after the core: the checker is built on it)


__version__ = "0.1.0"
__all__ = [
    "AttentionError",
    "Decision",
    "Mask",
    "MultiHeadAttention",
    "RoPE",
    "alibi_slopes",
    "attention",
    "capture_attention",
    "check",
    "dispatch",
    "textbook",
]
