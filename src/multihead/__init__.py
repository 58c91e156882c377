"""multihead: multi-head attention for PyTorch, correct under every convention, fast, and able to
explain itself.

    import multihead as mh
    out = mh.attention(q, k, v, mh.Mask.key_padding(pad), causal=True)   # (B, H, L, D)
    attn = mh.MultiHeadAttention(embed_dim=64, num_heads=8)
    y = attn(x, mask=mh.Mask.lengths(valid_lens))
"""
from multihead import textbook
from multihead.attention import attention
from multihead.cache import KVCache
from multihead.capture import capture_attention
from multihead.dispatch import Decision, dispatch
from multihead.errors import AttentionError
from multihead.masks import Mask
from multihead.module import MultiHeadAttention
from multihead.latent import MultiHeadLatentAttention
from multihead.positions import RoPE, alibi_slopes
from multihead.checker import check  # noqa: E402  (after the core: the checker is built on it)
from multihead import explain  # noqa: E402  mh.explain(...): the package is callable (explain/__init__.py)
from multihead import compat  # noqa: E402  mh.compat.MultiheadAttention, nn.MultiheadAttention's drop-in


__version__ = "0.1.0"
__all__ = [
    "AttentionError",
    "Decision",
    "KVCache",
    "Mask",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "RoPE",
    "alibi_slopes",
    "attention",
    "capture_attention",
    "check",
    "compat",
    "dispatch",
    "explain",
    "textbook",
]
