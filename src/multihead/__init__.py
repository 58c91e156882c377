"""multihead: multi-head attention for PyTorch, correct under every convention, fast, and able to
explain itself.

    import multihead as mh
    out = mh.attention(q, k, v, mh.Mask.key_padding(pad), causal=True)   # (B, H, L, D)
    attn = mh.MultiHeadAttention(embed_dim=64, num_heads=8)
    y = attn(x, mask=mh.Mask.lengths(valid_lens))

`import multihead` loads the core alone (attention, masks, backends, the module, the cache,
positions). The tools (check, explain, compat, textbook, convert, hf, parallel, bench) load on first
use, as attributes of this package (`mh.check`, `mh.explain(...)`) or by their own import.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from multihead.attention import attention
from multihead.caches.kv import KVCache
from multihead.capture import capture_attention, trace
from multihead.layers.differential import DifferentialAttention
from multihead.backends.dispatch import Decision, dispatch, register_backend
from multihead.backends.merge import merge_states
from multihead.errors import AttentionError
from multihead.layers.gated import GatedMultiHeadAttention
from multihead.layers.indexer import LightningIndexer
from multihead.masks import Mask
from multihead.layers.multi_head import MultiHeadAttention
from multihead.layers.latent import MultiHeadLatentAttention
from multihead.positions import RoPE, alibi_slopes
from multihead.layers.shared_kv import SharedKVAttention
from multihead import doors  # the facade's table of tools: each loads on first use

if TYPE_CHECKING:
    from multihead import compat, explain, textbook
    from multihead.checker import check

__version__ = "0.1.0"

def __getattr__(name: str):
    """The tools, loaded on first access (PEP 562) through the facade's one table (doors.TOOLS)."""
    if name not in doors.TOOLS:
        raise AttributeError(f"module 'multihead' has no attribute {name!r}")
    value = doors.load(*doors.TOOLS[name])
    globals()[name] = value  # the next access is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(doors.TOOLS))


__all__ = [
    "AttentionError",
    "Decision",
    "DifferentialAttention",
    "GatedMultiHeadAttention",
    "KVCache",
    "LightningIndexer",
    "Mask",
    "MultiHeadAttention",
    "MultiHeadLatentAttention",
    "RoPE",
    "SharedKVAttention",
    "alibi_slopes",
    "attention",
    "capture_attention",
    "check",
    "compat",
    "dispatch",
    "explain",
    "merge_states",
    "register_backend",
    "textbook",
    "trace",
]
