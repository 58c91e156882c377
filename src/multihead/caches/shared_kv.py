"""SharedKVCache: what a DeepSeek V4 layer (mh.SharedKVAttention) keeps: one K = V head, a window, compressed entries.

Shape legend: B batch, M max_len, W window, D head dim, m compress rate, Di indexer head dim.

Keys and values are one tensor (K = V): a token is stored once, D numbers, not 2D. Only the last W - 1 tokens are
kept exactly (`window` (B, 1, W - 1, D)); older ones live on in the compressed entries, D numbers per m tokens
(`compressor`, a CompressorState), and in a compressed-sparse layer Di per m tokens for its indexer (`indexer`).
Every sequence holds the same number of tokens (`held`): prompts of one length, one token per step.
"""
from __future__ import annotations

import torch

from multihead.caches.base import Cache, Part, positive
from multihead.caches.codec import codec_for
from multihead.errors import AttentionError
from multihead.layers.compressor import Compressed, CompressorState


class SharedKVCache(Cache):
    """The window (B, 1, W - 1, D) of K = V rows, and the compressors' states (None for a sliding layer)."""

    pageable = False

    def __init__(self, batch_size: int, max_len: int, head_dim: int, window: int, *,
                 compressor: CompressorState | None = None, indexer: CompressorState | None = None,
                 rate: int | None = None, device=None, dtype=None):
        positive("SharedKVCache", head_dim=head_dim, window=window)
        super().__init__(batch_size, max_len, (Part("window", 1, head_dim),), codec=codec_for(None, dtype),
                         slots=window - 1, device=device)
        self.window_size, self.rate = window, rate
        self.compressor, self.indexer = compressor, indexer

    def window_rows(self) -> torch.Tensor:
        """(B, 1, min(held, W - 1), D): the last tokens' K = V rows, oldest first."""
        return self.window[:, :, :min(self.held, self.window_size - 1)]

    def check_step(self, B: int, L: int, dtype: torch.dtype, device: torch.device) -> None:
        """AttentionError, before anything is computed or written, for a call of L tokens the cache cannot take."""
        self.check_call(None, B, 1, self.parts[0].width)
        if dtype != self.window.dtype or device != self.window.device:
            raise AttentionError(f"the cache holds {self.window.dtype} on {self.window.device}; got {dtype} on "
                                 f"{device}.")
        self.check_room(L)

    def commit(self, rows: torch.Tensor, compressed: Compressed | None, indexed: Compressed | None) -> None:
        """After a call's attention: keep the last W - 1 of the window and new rows (B, 1, L, D), and the
        compressors' results."""
        start, L = self.held, rows.shape[2]
        if self.window_size > 1:
            kept = torch.cat((self.window_rows(), rows), dim=2)[:, :, -(self.window_size - 1):]
            self.window[:, :, :kept.shape[2]] = kept
        for state, update in ((self.compressor, compressed), (self.indexer, indexed)):
            if state is not None:
                state.commit(update, start, self.rate)
        self._filled += L
        self.lengths.add_(L)

    def bytes_per_token(self) -> float:
        """What each further token of a sequence costs (bytes, this layer): (D + Di) / m numbers, the
        compressed entries; 0 for a sliding layer, whose window is all it keeps."""
        size = self.window.element_size()
        return float(sum(s.entries.shape[-1] for s in (self.compressor, self.indexer) if s is not None)) * size / (
            self.rate or 1)

    def fixed_bytes(self) -> int:
        """Bytes per sequence that do not grow with its length: the window and the compressors' unfinished blocks."""
        fixed = [self.window] + [b for s in (self.compressor, self.indexer) if s is not None
                                 for name, b in s.named_buffers() if name != "entries"]
        return sum(b[0].nbytes for b in fixed)

    def memory_bytes(self) -> int:
        """Bytes held for tokens: the window and the compressors' states, every sequence."""
        return sum(b.nbytes for name, b in self.named_buffers() if name != "lengths")

    def extra_repr(self) -> str:
        kind = "sliding" if self.compressor is None else ("compressed-sparse" if self.indexer else "heavily compressed")
        return f"{super().extra_repr()}, window={self.window_size}, {kind}"
