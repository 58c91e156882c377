"""SharedKVAttention: DeepSeek V4's attention, one K = V head over a sliding window and compressed blocks.

Shape legend: B batch, L tokens, E embed_dim, H heads, D head_dim, R rotary features (the last R of
each head), Cq q_lora_rank, W window, m compress rate, N compressed entries, K index top-k, G output
groups, O o_lora_rank.

    c_q = q_a_norm(q_a_proj(x))                       (B, L, Cq)   low-rank query, also the indexer's
    q   = rms(q_b_proj(c_q)) per head, RoPE           (B, H, L, D)
    kv  = RoPE(kv_norm(kv_proj(x)))                   (B, 1, L, D) one head: the key AND the value
    out = softmax(q · [window | entries] / sqrt(D), sinks) · [window | entries]
    out = RoPE⁻¹(out) on its last R features          the values carried the keys' turn: undo it at the query
    y   = o_b_proj(o_a_proj(out) per group of heads)  (B, L, E): a grouped low-rank output projection

Each query sees the W tokens up to itself (the sliding window) and, in compressed layers, entries that
summarise complete blocks of m earlier tokens (mh.compressor.BlockCompressor). Three layer types:

    sliding              compress_rate=None                  the window alone
    heavily compressed   compress_rate=m (V4: 128)           + every complete block's entry
    compressed-sparse    compress_rate=m (V4: 4), index_*    + the top-K complete blocks that a lightning
                                                               indexer (mh.indexer.BlockIndexer) picks;
                                                               blocks overlap (2m tokens each)

Per-head sink logits join every row's softmax denominator (gpt-oss). Keys and values being one tensor,
a decoder caches each token once (mh.shared_kv_cache.SharedKVCache), and only W - 1 tokens exactly.
The selected keys of compressed layers are attended through `attend_selected`.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.attention import attention
from multihead.layers.compressor import BlockCompressor, turn_trailing
from multihead.errors import AttentionError, check_hidden, check_number
from multihead.layers.indexer import BlockIndexer, complete_blocks
from multihead.masks import Mask
from multihead.positions import RoPE
from multihead.services import service
from multihead.layers.selected_attention import attend_selected
from multihead.caches.codec import FLOATS
from multihead.caches.new import new_cache
from multihead.caches.shared_kv import SharedKVCache


class GroupedLinear(nn.Linear):
    """A block-diagonal Linear: input (..., G, I) -> (..., G, O), group g through rows g·O ... g·O + O - 1 of
    `weight` (G·O, I)."""

    def __init__(self, in_per_group: int, out_features: int, groups: int, **factory) -> None:
        super().__init__(in_per_group, out_features, bias=False, **factory)
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.view(self.groups, -1, self.in_features)  # (G, O, I)
        return torch.einsum("...gi,goi->...go", x, w)


class SharedKVAttention(nn.Module):
    """DeepSeek V4's attention with transformers' weight names: q_a_proj, q_a_norm, q_b_proj, kv_proj,
    kv_norm, o_a_proj (grouped), o_b_proj, sinks, compressor (a BlockCompressor) and indexer (a
    BlockIndexer).

    embed_dim E, num_heads H, head_dim D, q_lora_rank Cq, window W. rope: an mh.RoPE over the R
    trailing features (V4: R = 64 of D = 512, interleaved pairs). compress_rate m: None for a sliding
    layer. index_heads, index_head_dim, index_topk: a compressed-sparse layer's indexer (all or none; its
    compressor then overlaps blocks). o_groups G and o_lora_rank O: the output projection. norm_eps: of
    every norm. scale: the factor on q·k (default D ** -0.5). The layer is causal; inputs (B, L, E).
    """

    def __init__(self, embed_dim: int, num_heads: int, head_dim: int, *, q_lora_rank: int, rope: RoPE, window: int,
                 o_groups: int, o_lora_rank: int, compress_rate: int | None = None, index_heads: int | None = None,
                 index_head_dim: int | None = None, index_topk: int | None = None, norm_eps: float = 1e-6,
                 scale: float | None = None, dropout: float = 0.0, backend: str = "auto",
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        sizes = {"embed_dim": embed_dim, "num_heads": num_heads, "head_dim": head_dim, "q_lora_rank": q_lora_rank,
                 "window": window, "o_groups": o_groups, "o_lora_rank": o_lora_rank}
        optional = {"compress_rate": compress_rate, "index_heads": index_heads, "index_head_dim": index_head_dim,
                    "index_topk": index_topk}
        for name, value in [*sizes.items(), *((n, v) for n, v in optional.items() if v is not None)]:
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AttentionError(f"{name} must be a positive int; got {value!r}.")
        index = (index_heads, index_head_dim, index_topk)
        if any(v is not None for v in index) and (None in index or compress_rate is None):
            raise AttentionError(f"a compressed-sparse layer takes index_heads, index_head_dim, index_topk and "
                                 f"compress_rate together; got {index} and compress_rate={compress_rate}.")
        if (num_heads * head_dim) % o_groups:
            raise AttentionError(f"o_groups={o_groups} must divide num_heads * head_dim = {num_heads * head_dim}.")
        if not isinstance(rope, RoPE) or rope.head_dim > min(head_dim, index_head_dim or head_dim):
            raise AttentionError(f"rope must be an mh.RoPE over at most head_dim={head_dim} (and index_head_dim) "
                                 f"features; got {rope!r}.")
        check_number(norm_eps, "norm_eps", "a positive number", lambda x: x > 0)
        check_number(dropout, "dropout", "a probability in [0, 1)", lambda x: 0.0 <= x < 1.0)
        if scale is not None:
            check_number(scale, "scale", "a positive finite number or None", lambda x: 0 < x < float("inf"))
        self.embed_dim, self.num_heads, self.head_dim, self.window = embed_dim, num_heads, head_dim, window
        self.compress_rate, self.norm_eps, self.dropout, self.backend = compress_rate, norm_eps, float(dropout), backend
        self.scale = float(scale) if scale is not None else head_dim ** -0.5
        factory = {"device": device, "dtype": dtype}
        self.q_a_proj = nn.Linear(embed_dim, q_lora_rank, bias=False, **factory)
        self.q_a_norm = nn.RMSNorm(q_lora_rank, eps=norm_eps, **factory)
        self.q_b_proj = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False, **factory)
        self.kv_proj = nn.Linear(embed_dim, head_dim, bias=False, **factory)
        self.kv_norm = nn.RMSNorm(head_dim, eps=norm_eps, **factory)
        self.o_a_proj = GroupedLinear(num_heads * head_dim // o_groups, o_groups * o_lora_rank, o_groups, **factory)
        self.o_b_proj = nn.Linear(o_groups * o_lora_rank, embed_dim, bias=False, **factory)
        self.sinks = nn.Parameter(torch.zeros(num_heads, **factory))
        self.rope = rope
        sparse = index_topk is not None
        self.compressor = None if compress_rate is None else BlockCompressor(
            embed_dim, head_dim, compress_rate, overlap=sparse, rope=rope, norm_eps=norm_eps, **factory)
        self.indexer = None if not sparse else BlockIndexer(
            embed_dim, q_lora_rank, index_heads, index_head_dim, index_topk, compress_rate, rope=rope,
            norm_eps=norm_eps, **factory)

    @classmethod
    def from_module(cls, module: nn.Module) -> SharedKVAttention:
        """The SharedKVAttention of a transformers DeepseekV4Attention layer, same weights and outputs (the
        convert tool's work)."""
        return service("shared_kv_from_module")(module)

    @property
    def layer_type(self) -> str:
        """"sliding", "heavily_compressed" or "compressed_sparse"."""
        if self.compressor is None:
            return "sliding"
        return "compressed_sparse" if self.indexer is not None else "heavily_compressed"

    def new_cache(self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None,
                  kv_dtype: torch.dtype | None = None, **options) -> SharedKVCache:
        """An empty SharedKVCache for batch_size sequences of up to max_len tokens (kv_dtype: a float dtype, as
        dtype=; the window and the compressed entries take no codes and no pages)."""
        weight = self.kv_proj.weight
        held = dtype or (kv_dtype if kv_dtype in FLOATS else None) or weight.dtype
        states = [None if c is None else c.new_state(batch_size, max_len, dtype=held)
                  for c in (self.compressor, None if self.indexer is None else self.indexer.compressor)]
        return new_cache(SharedKVCache, weight, batch_size, max_len, head_dim=self.head_dim, window=self.window,
                         compressor=states[0], indexer=states[1], rate=self.compress_rate, dtype=dtype,
                         kv_dtype=kv_dtype, **options)

    def forward(self, x: torch.Tensor, *, cache: SharedKVCache | None = None) -> torch.Tensor:
        """Causal self-attention of x (B, L, E) -> (B, L, E), at positions 0 ... L - 1, or after the tokens
        `cache` holds (a SharedKVCache from new_cache(), which this call then extends)."""
        self._check_input(x, cache)
        B, L, _ = x.shape
        start = 0 if cache is None else cache.held
        positions = start + torch.arange(L, device=x.device)  # (L,)
        q_resid = self.q_a_norm(self.q_a_proj(x))  # (B, L, Cq)
        q = self.q_b_proj(q_resid).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)  # (B, H, L, D)
        q = q * torch.rsqrt(q.float().square().mean(-1, keepdim=True) + self.norm_eps).to(q.dtype)  # weightless RMS
        q = turn_trailing(q, self.rope, positions)
        rows = turn_trailing(self.kv_norm(self.kv_proj(x))[:, None], self.rope, positions)  # (B, 1, L, D): K = V
        window = rows if cache is None else torch.cat((cache.window_rows(), rows), dim=2)  # (B, 1, Lt, D)
        options = {"scale": self.scale, "sinks": self.sinks, "dropout": self.dropout if self.training else 0.0,
                   "backend": self.backend}
        compressed = indexed = None
        if self.compressor is None:
            keep = Mask.window(self.window, "bottom_right") & Mask.causal("bottom_right")
            out = attention(q, window, window, keep, **options)  # (B, H, L, D)
        else:
            state = None if cache is None else cache.compressor
            compressed = self.compressor(x, state, start)  # entries (B, N, D)
            if self.indexer is not None:  # (B, L, K) the top-K complete blocks
                picked, indexed = self.indexer(x, q_resid, start, None if cache is None else cache.indexer)
            else:  # (L, N): every complete block
                N = compressed.entries.shape[1]
                complete = complete_blocks(positions, N, self.compress_rate)
                picked = torch.where(complete, torch.arange(N, device=x.device), -1)
            keys = torch.cat((window, compressed.entries[:, None]), dim=2)  # (B, 1, Lt + N, D)
            out = attend_selected(q, keys, keys, self._selection(picked, window.shape[2], B, L), **options)
        out = turn_trailing(out, self.rope, positions, inverse=True)  # (B, H, L, D)
        out = self.o_a_proj(out.transpose(1, 2).reshape(B, L, self.o_a_proj.groups, -1))  # (B, L, G, O)
        y = self.o_b_proj(out.flatten(2))  # (B, L, E)
        if cache is not None:
            cache.commit(rows, compressed, indexed)
        return y

    def _selection(self, picked: torch.Tensor, Lt: int, B: int, L: int) -> torch.Tensor:
        """The keys each query attends to, in [window rows (Lt) | entries]: the W window rows up to the
        query (the last L of the Lt rows are this call's tokens) and the picked entries (B|1, L, P), -1
        for none -> (B, L, W + P)."""
        back = torch.arange(self.window, device=picked.device)  # 0 ... W - 1 tokens back
        rows = (Lt - L) + torch.arange(L, device=picked.device)[:, None] - back  # (L, W)
        rows = torch.where(rows >= 0, rows, -1).expand(B, L, self.window)
        entries = torch.where(picked >= 0, picked + Lt, -1).expand(B, L, picked.shape[-1])
        return torch.cat((rows, entries), dim=-1)

    def _check_input(self, x, cache) -> None:
        check_hidden(x, self.embed_dim, self.kv_proj.weight)
        if cache is None:
            return
        if not isinstance(cache, SharedKVCache) or (cache.window_size, cache.rate, cache.window.shape[-1]) != (
                self.window, self.compress_rate, self.head_dim) or (cache.indexer is None) != (self.indexer is None):
            raise AttentionError(f"cache must be a SharedKVCache from this layer's new_cache(); got {cache!r:.200}.")
        cache.check_step(x.shape[0], x.shape[1], x.dtype, x.device)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
                f"window={self.window}, layer_type={self.layer_type!r}, scale={self.scale:.6g}")
