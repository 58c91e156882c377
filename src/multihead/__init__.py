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


def check(module, **options):
    """Check a learner's attention module against the reference; returns a report (see multihead.check)."""
    from multihead.check import check as run_check

    return run_check(module, **options)


__version__ = "0.1.0"
__all__ = [
    "AttentionError",
    "Decision",
    "Mask",
    "MultiHeadAttention",
    "attention",
    "capture_attention",
    "check",
    "dispatch",
    "textbook",
]
