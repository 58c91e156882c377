"""LatentCache: what multi-head latent attention (MLA) caches, the latent and the rotary key of each token.

Shape legend: B batch, M max_len, C latent width (kv_lora_rank), R rotary key width (qk_rope_head_dim),
Di the lightning indexer's key width, Lq new tokens.

    cache = mla.new_cache(batch_size=B, max_len=M)   # latents (B, M, C), rope_keys (B, M, R), lengths (B,)
    y = mla(prompt, cache=cache)                     # prefill: writes Lq tokens per sequence
    y = mla(next_token, cache=cache)                 # decode: one more per sequence

Every head's keys and values are computed from the latent, so a token costs (C + R) numbers per layer
instead of H · (D + Dv). Both live in one buffer, `keys` (B, 1, M, C + R) = [latent | rotary key], so
that the absorbed decode step attends to it as multi-query attention with one key/value head whose
values are the first C features (`values`, a view). `latents` and `rope_keys` are views of the parts.

A layer with a lightning indexer (DeepSeek V3.2, GLM-MoE-DSA) also caches the indexer's key of each
token: `index_dim=Di` adds `index_keys` (B, M, Di) beside the latents, written by the same call.

It is a KVCache with one key/value head and shares its interface and its rules: `lengths`, `reset()`,
`reorder(index)`, `positions(Lq)`, ragged batches, bottom-right causal alignment per sequence, and a
call that cannot be done raises AttentionError and leaves the cache as it was.
"""
from __future__ import annotations

import torch

from multihead.caches.kv import KVCache
from multihead.errors import AttentionError, shape_str


class LatentCache(KVCache):
    """Preallocated latents (B, M, C) and rotary keys (B, M, R), stored together as keys (B, 1, M, C + R);
    with index_dim=Di, the indexer's keys (B, M, Di) too."""

    def __init__(self, batch_size: int, max_len: int, latent_dim: int, rope_dim: int, *, index_dim: int | None = None,
                 device=None, dtype=None):
        for name, n in (("latent_dim", latent_dim), ("rope_dim", rope_dim), ("index_dim", index_dim or 1)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise AttentionError(f"LatentCache {name} must be a positive int; got {n!r}.")
        self.latent_dim, self.rope_dim, self.index_dim = latent_dim, rope_dim, index_dim
        super().__init__(batch_size, max_len, 1, latent_dim + rope_dim, value_dim=latent_dim,
                         device=device, dtype=dtype)

    def _allocate(self, B: int, M: int, Hkv: int, D: int, Dv: int, factory: dict) -> None:
        self.register_buffer("keys", torch.zeros(B, Hkv, M, D, **factory))  # values are a view of it
        if self.index_dim is not None:  # (B, 1, M, Di): the layout KVCache writes along dim 2
            self.register_buffer("index_store", torch.zeros(B, 1, M, self.index_dim, **factory))
        else:
            self.index_store = None

    @property
    def values(self) -> torch.Tensor:
        """(B, 1, M, C): the latents, as the values of multi-query attention (a view of `keys`)."""
        return self.keys[..., :self.latent_dim]

    @property
    def held(self) -> int:
        """Slots in use (the longest sequence's length, known on the host in eager; max_len once compiled)."""
        return self._filled

    @property
    def latents(self) -> torch.Tensor:
        """(B, M, C): every token's normalised latent (a view)."""
        return self.keys[:, 0, :, :self.latent_dim]

    @property
    def rope_keys(self) -> torch.Tensor:
        """(B, M, R): every token's shared rotary key, already turned to its position (a view)."""
        return self.keys[:, 0, :, self.latent_dim:]

    @property
    def index_keys(self) -> torch.Tensor | None:
        """(B, M, Di): every token's lightning-indexer key, turned to its position (a view); None without."""
        return None if self.index_store is None else self.index_store[:, 0]

    def append_latent(self, latent: torch.Tensor, rope_key: torch.Tensor, new_tokens: torch.Tensor | None = None,
                      index_key: torch.Tensor | None = None):
        """Write latent (B, Lq, C), turned rope_key (B, Lq, R) and, in a cache with index_dim, the indexer's
        index_key (B, Lq, Di) after each sequence's tokens.

        new_tokens (B,): how many of the Lq tokens are real per sequence (right padding); default Lq.
        Returns (keys, mask): keys (B, 1, Lc, C + R) to attend to (values: keys[..., :C]) and the Mask
        that makes the attention causal within each sequence's own length. `index_keys[:, :Lc]` then
        holds the indexer's keys of the same Lc slots.
        """
        B, C, R = self.keys.shape[0], self.latent_dim, self.rope_dim
        parts = [("latent", latent, C), ("rope_key", rope_key, R)]
        if (index_key is None) != (self.index_dim is None):
            raise AttentionError(f"this latent cache {'holds' if self.index_dim else 'has no'} indexer keys; "
                                 f"got index_key={'None' if index_key is None else 'a tensor'}.")
        if index_key is not None:
            parts.append(("index_key", index_key, self.index_dim))
        for name, t, width in parts:
            if not isinstance(t, torch.Tensor) or t.dim() != 3 or t.shape[0] != B or t.shape[2] != width:
                got = shape_str(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise AttentionError(f"latent cache {name} must be (B={B}, Lq, {width}); got {got}.")
            if t.shape[1] != latent.shape[1]:
                raise AttentionError(f"latent and {name} must add the same number of tokens; got "
                                     f"{latent.shape[1]} and {t.shape[1]}.")
            if t.dtype != latent.dtype or t.device != latent.device:
                raise AttentionError(f"latent and {name} must share dtype and device; got {latent.dtype} on "
                                     f"{latent.device} and {t.dtype} on {t.device}.")
        joined = torch.cat((latent, rope_key), dim=-1)[:, None]  # (B, 1, Lq, C + R)
        if index_key is not None:  # checked like the keys first, so that a refused call writes nothing
            self._check(joined, joined[..., :C], new_tokens)
            self._write(self.index_store, index_key[:, None])
        # KVCache checks, writes and masks; it also writes the values, a view of the same slots: same numbers
        keys, _, mask = self.append(joined, joined[..., :C], new_tokens)
        return keys, mask

    def resized(self, index: torch.Tensor | None = None, max_len: int | None = None) -> LatentCache:
        """A new cache holding the sequences `index` (any length, repeats allowed; default all) with room
        for max_len tokens each (default this one's, and never less than what they already hold)."""
        B, _, M, _ = self.keys.shape
        index = torch.arange(B, device=self.keys.device) if index is None else index
        if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int32, torch.int64) or index.dim() != 1:
            raise AttentionError(f"resized expects a 1-D integer tensor of sequence indices; got {index!r:.80}.")
        if index.numel() and not bool(((index >= 0) & (index < B)).all()):
            raise AttentionError(f"resized indices must lie in [0, {B}); got {index.tolist()}.")
        held = self.held
        max_len = M if max_len is None else max_len
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < held:
            raise AttentionError(f"resized expects max_len >= {held} (the tokens held); got {max_len!r}.")
        new = self._fresh(index.numel(), max_len)
        index = index.to(self.keys.device)
        for name, buffer in self.named_buffers(recurse=False):  # keys, index keys, a quantized cache's scales
            if name != "lengths":  # (B, 1, M, ...): slots along dim 2
                getattr(new, name)[:, :, :held] = buffer[index, :, :held]
        new.lengths.copy_(self.lengths[index])
        new._filled, new._same_lengths = held, self._same_lengths
        return new

    def _fresh(self, batch_size: int, max_len: int) -> LatentCache:
        """An empty cache like this one (widths, dtype, device) for batch_size sequences of max_len."""
        return LatentCache(batch_size, max_len, self.latent_dim, self.rope_dim, index_dim=self.index_dim,
                           device=self.keys.device, dtype=self.keys.dtype)

    def reset(self) -> None:
        """Empty every sequence; the indexer's keys are zeroed with the latents."""
        super().reset()
        if self.index_store is not None:
            self.index_store.zero_()

    def bytes_per_token(self) -> int:
        """(C + R + Di) · element size: what one token costs this cache (per layer; Di = 0 without indexer)."""
        return (self.latent_dim + self.rope_dim + (self.index_dim or 0)) * self.keys.element_size()

    def extra_repr(self) -> str:
        B, _, M, _ = self.keys.shape
        index = f", index_dim={self.index_dim}" if self.index_dim else ""
        return f"batch_size={B}, max_len={M}, latent_dim={self.latent_dim}, rope_dim={self.rope_dim}{index}"
