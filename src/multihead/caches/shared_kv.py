"""SharedKVCache: what a DeepSeek V4 attention layer (mh.SharedKVAttention) keeps between decode calls.

Shape legend: B batch, M max_len, W window, D head dim, m compress rate, Di indexer head dim.

    cache = layer.new_cache(batch_size=B, max_len=M)
    y = layer(prompt, cache=cache)        # prefill
    y = layer(next_token, cache=cache)    # one more token per sequence

Keys and values are one tensor (K = V), so each token is stored once, D numbers, not 2D. And only the
last W - 1 tokens are kept exactly (`window` (B, 1, W - 1, D)): older tokens live on in the compressed
entries, D numbers per m tokens (`compressor`, a CompressorState), and in a compressed-sparse layer
also Di numbers per m tokens for its indexer (`indexer`). So a sequence costs a fixed amount for the
window and the unfinished blocks, plus (D + Di) / m numbers per token (`bytes_per_token`).

Every sequence of the batch holds the same number of tokens (`held`; the compressors close blocks at
the same steps for all): prompts of one length, one token per step. A call that cannot be done (no
room left, a batch, dtype or device mismatch) raises AttentionError and leaves the cache as it was.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.layers.compressor import Compressed, CompressorState
from multihead.errors import AttentionError


class SharedKVCache(nn.Module):
    """The window (B, 1, W - 1, D) of K = V rows, and the compressors' states (None for a sliding layer)."""

    def __init__(self, batch_size: int, max_len: int, head_dim: int, window: int, *,
                 compressor: CompressorState | None = None, indexer: CompressorState | None = None,
                 rate: int | None = None, device=None, dtype=None):
        super().__init__()
        for name, n in (("batch_size", batch_size), ("max_len", max_len), ("head_dim", head_dim), ("window", window)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise AttentionError(f"SharedKVCache {name} must be a positive int; got {n!r}.")
        self.window_size, self.rate, self._max_len = window, rate, max_len
        self.register_buffer("window", torch.zeros(batch_size, 1, window - 1, head_dim, device=device, dtype=dtype))
        self.register_buffer("lengths", torch.zeros(batch_size, dtype=torch.long, device=device))
        self.compressor, self.indexer = compressor, indexer
        self.held = 0  # tokens per sequence (the same for every sequence), known on the host

    @property
    def max_len(self) -> int:
        return self._max_len

    def window_rows(self) -> torch.Tensor:
        """(B, 1, min(held, W - 1), D): the last tokens' K = V rows, oldest first."""
        return self.window[:, :, :min(self.held, self.window_size - 1)]

    def positions(self, L: int) -> torch.Tensor:
        """(L,) the positions of the next L tokens (the same for every sequence)."""
        return self.held + torch.arange(L, device=self.lengths.device)

    def check_call(self, B: int, L: int, dtype: torch.dtype, device: torch.device) -> None:
        """AttentionError, before anything is computed or written, for a call of L tokens the cache cannot take."""
        if B != self.window.shape[0]:
            raise AttentionError(f"the cache is for batch {self.window.shape[0]}; this call has batch {B}.")
        if dtype != self.window.dtype or device != self.window.device:
            raise AttentionError(f"the cache holds {self.window.dtype} on {self.window.device}; got {dtype} on "
                                 f"{device}.")
        if self.held + L > self.max_len:
            raise AttentionError(f"the cache holds up to max_len={self.max_len} tokens per sequence; writing {L} more "
                                 f"after {self.held} would pass it. Make a larger cache with "
                                 "new_cache(batch_size, max_len).")

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
        self.held += L
        self.lengths.add_(L)

    def reset(self) -> None:
        """Empty every sequence (the buffers are zeroed)."""
        for buf in self.buffers():
            buf.zero_()
        self.held = 0

    def reorder(self, index: torch.Tensor) -> None:
        """Beam search: sequence b becomes the old sequence index[b]. index: (B,) integers in [0, B)."""
        B = self.window.shape[0]
        if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int32, torch.int64) or index.shape != (B,):
            raise AttentionError(f"reorder expects an integer tensor of shape (B={B},); got {index!r:.80}.")
        index = index.to(self.window.device)
        if index.device.type == "cpu" and B and not bool(((index >= 0) & (index < B)).all()):
            raise AttentionError(f"reorder indices must lie in [0, {B}); got {index.tolist()}.")
        for buf in self.buffers():
            buf.copy_(buf.index_select(0, index))

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

    def extra_repr(self) -> str:
        B, _, _, D = self.window.shape
        kind = "sliding" if self.compressor is None else ("compressed-sparse" if self.indexer else "heavily compressed")
        return f"batch_size={B}, max_len={self.max_len}, head_dim={D}, window={self.window_size}, {kind}"
