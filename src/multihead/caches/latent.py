"""LatentCache: what multi-head latent attention (MLA) caches, the latent and rotary key of each token (a layout).

Shape legend: B batch, M max_len, C latent width (kv_lora_rank), R rotary key width, Di indexer key width.

    cache = mla.new_cache(batch_size=B, max_len=M)   # keys (B, 1, M, C + R) = [latent | rotary key], lengths (B,)

A token costs C + R numbers per layer instead of H · (D + Dv). The absorbed decode step attends to `keys` as
multi-query attention with one key/value head whose values are the first C features (`values`, a view);
`latents` and `rope_keys` are views of the parts. Quantized, the latent and the rotary key get a scale each,
`scales` (B, 1, M, 2) (the latent is normalised, the rotary key is not). index_dim=Di (DeepSeek V3.2,
GLM-MoE-DSA) adds the lightning indexer's keys `index_keys` (B, M, Di), in the model's dtype whatever the codec.
"""
from __future__ import annotations

import torch

from multihead.caches.base import Cache, Part, positive
from multihead.caches.codec import codec_for
from multihead.caches.pages import materialized
from multihead.errors import AttentionError, shape_str


class LatentCache(Cache):
    """Latents (B, M, C) and rotary keys (B, M, R), stored together as keys (B, 1, M, C + R); with index_dim=Di,
    the indexer's keys (B, M, Di) too."""

    def __init__(self, batch_size: int, max_len: int, latent_dim: int, rope_dim: int, *, index_dim: int | None = None,
                 kv_dtype: torch.dtype | None = None, page_size: int | None = None, num_pages: int | None = None,
                 device=None, dtype=None):
        positive("LatentCache", latent_dim=latent_dim, rope_dim=rope_dim, index_dim=index_dim or 1)
        parts = (Part("keys", 1, latent_dim + rope_dim, "latent_pages", "scales", split=latent_dim),) + (
            () if index_dim is None else (Part("index_store", 1, index_dim, "index_pages", coded=False),))
        self.latent_dim, self.rope_dim, self.index_dim = latent_dim, rope_dim, index_dim
        super().__init__(batch_size, max_len, parts, codec=codec_for(kv_dtype, dtype), page_size=page_size,
                         num_pages=num_pages, device=device)

    @property
    def values(self) -> torch.Tensor:
        """(B, 1, M, C): the latents, as the values of multi-query attention (a view of `keys`)."""
        return self.keys[..., :self.latent_dim]

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
        """(B, M, Di) contiguous, (B, held, Di) paged: every token's lightning-indexer key, turned to its
        position; None without."""
        return None if self.index_dim is None else self.read(self.parts[1], None if self.paged else self.max_len)[:, 0]

    def append_latent(self, latent: torch.Tensor, rope_key: torch.Tensor, new_tokens: torch.Tensor | None = None,
                      index_key: torch.Tensor | None = None):
        """Write latent (B, Lq, C), turned rope_key (B, Lq, R) and, in a cache with index_dim, the indexer's
        index_key (B, Lq, Di) after each sequence's tokens.

        new_tokens (B,): how many of the Lq tokens are real per sequence (right padding); default Lq.
        Returns (keys, mask): keys (B, 1, Lc, C + R) to attend to (values: keys[..., :C]; `Quantized` with
        split=C in a quantized cache) and the Mask that makes the attention causal within each sequence's
        own length. `index_keys[:, :Lc]` then holds the indexer's keys of the same Lc slots.
        """
        B, C, R = self.batch_size, self.latent_dim, self.rope_dim
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
        views, mask = self.store((joined,) if index_key is None else (joined, index_key[:, None]), new_tokens)
        return materialized(views[0]), mask

    def resized(self, index: torch.Tensor | None = None, max_len: int | None = None) -> LatentCache:
        """A new contiguous cache holding the sequences `index` (any length, repeats allowed; default all) with
        room for max_len tokens each (default this one's, and never less than what they already hold)."""
        B, held = self.batch_size, self.held
        index = torch.arange(B, device=self.lengths.device) if index is None else index
        if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int32, torch.int64) or index.dim() != 1:
            raise AttentionError(f"resized expects a 1-D integer tensor of sequence indices; got {index!r:.80}.")
        if index.numel() and not bool(((index >= 0) & (index < B)).all()):
            raise AttentionError(f"resized indices must lie in [0, {B}); got {index.tolist()}.")
        max_len = self.max_len if max_len is None else max_len
        if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < held:
            raise AttentionError(f"resized expects max_len >= {held} (the tokens held); got {max_len!r}.")
        new = LatentCache(index.numel(), max_len, self.latent_dim, self.rope_dim, index_dim=self.index_dim,
                          kv_dtype=self.kv_dtype, device=self.lengths.device, dtype=self.codec.dtype)
        index = index.to(self.lengths.device)
        for p in self.parts:  # the held slots, read through the storage (contiguous or paged)
            numbers = self.read(p, held)
            numbers = (numbers.codes, numbers.scales) if self.codec.quantized and p.coded else (numbers, None)
            for name, t in zip((p.name, p.scales), numbers):
                if t is not None:
                    getattr(new, name)[:, :, :held] = t[index]
        new.lengths.copy_(self.lengths[index])
        new._filled, new._same_lengths = held, self._same_lengths
        return new

    def extra_repr(self) -> str:
        index = f", index_dim={self.index_dim}" if self.index_dim else ""
        return f"{super().extra_repr()}, latent_dim={self.latent_dim}, rope_dim={self.rope_dim}{index}"
