"""KVCache: the keys and values a decoder has seen, preallocated, one length per sequence.

Shape legend: B batch, Hkv key/value heads, M max_len, D head dim, Dv value head dim, Lq new tokens.

    cache = attn.new_cache(batch_size=B, max_len=M)     # keys (B, Hkv, M, D), values (B, Hkv, M, Dv)
    y = attn(prompt, cache=cache)                       # prefill: writes Lq tokens per sequence
    y = attn(next_token, cache=cache)                   # decode: one more per sequence

Each call writes its keys and values at each sequence's own length, then attends to everything
cached, causally aligned bottom-right: the new tokens of sequence b sit at positions
lengths[b] ... lengths[b] + n_b - 1. Ragged batches decode together: a right-padded prompt prefilled
with `Mask.lengths(lens, query_lens=lens)` advances each sequence by its own length.

Slots past a sequence's length are never attended to. A call that cannot be done (no room left, a
batch, head, dtype or device mismatch) raises AttentionError and leaves the cache as it was.

Under torch.compile the cache attends over all M slots (static shapes: no recompiles from one step
to the next); in eager it attends only up to the longest sequence so far. Compiled, the capacity check
is a device-side assertion (no host sync): a call past max_len fails with a RuntimeError naming it.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.errors import AttentionError, shape_str
from multihead.masks import Mask
from multihead.masks.values import values_checkable

BOTTOM_RIGHT = Mask.causal("bottom_right")  # every sequence's new tokens line up with its last cached ones
OVERFLOW = "the KV cache has no room for these tokens: make a larger cache with new_cache(batch_size, max_len)"


class KVCache(nn.Module):
    """Preallocated keys (B, Hkv, M, D), values (B, Hkv, M, Dv) and lengths (B,): buffers, not parameters."""

    def __init__(self, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int, *,
                 value_dim: int | None = None, device=None, dtype=None):
        super().__init__()
        for name, n in (("batch_size", batch_size), ("max_len", max_len), ("num_kv_heads", num_kv_heads),
                        ("head_dim", head_dim), ("value_dim", value_dim or head_dim)):
            if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
                raise AttentionError(f"KVCache {name} must be a positive int; got {n!r}.")
        Dv = value_dim or head_dim
        self._allocate(batch_size, max_len, num_kv_heads, head_dim, Dv, {"device": device, "dtype": dtype})
        self.register_buffer("lengths", torch.zeros(batch_size, dtype=torch.long, device=device))
        self._filled = 0  # eager only: an upper bound on every length, known on the host without a sync
        self._same_lengths = True  # eager only: every sequence has exactly `_filled` tokens

    def _allocate(self, B: int, M: int, Hkv: int, D: int, Dv: int, factory: dict) -> None:
        """Register the `keys` (B, Hkv, M, D) and `values` (B, Hkv, M, Dv) buffers (a subclass may share them)."""
        self.register_buffer("keys", torch.zeros(B, Hkv, M, D, **factory))
        self.register_buffer("values", torch.zeros(B, Hkv, M, Dv, **factory))

    @property
    def max_len(self) -> int:
        return self.keys.shape[2]

    def reset(self) -> None:
        """Empty every sequence (the slots are zeroed, so stale values can never reach an output)."""
        self.keys.zero_()
        self.values.zero_()
        self.lengths.zero_()
        self._filled, self._same_lengths = 0, True

    def reorder(self, index: torch.Tensor) -> None:
        """Beam search: sequence b becomes the old sequence index[b]. index: (B,) integers in [0, B)."""
        B = self.keys.shape[0]
        if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int32, torch.int64) or tuple(index.shape) != (B,):
            raise AttentionError(f"reorder expects an integer tensor of shape (B={B},); got {_describe(index)}.")
        index = index.to(self.keys.device)
        if values_checkable(index) and B and not bool(((index >= 0) & (index < B)).all()):
            raise AttentionError(f"reorder indices must lie in [0, {B}); got {index.tolist()}.")
        for buf in self.buffers(recurse=False):  # keys, values, lengths (each storage once)
            buf.copy_(buf.index_select(0, index))

    def append(self, k: torch.Tensor, v: torch.Tensor, new_tokens: torch.Tensor | None = None):
        """Write k (B, Hkv, Lq, D), v (B, Hkv, Lq, Dv) after each sequence's tokens.

        new_tokens (B,): how many of the Lq tokens are real per sequence (right padding); default Lq.
        Returns (keys, values, mask): the cached keys/values to attend to and the Mask that makes the
        attention causal within each sequence's own length.
        """
        self._check(k, v, new_tokens)
        return self._commit(k, v, new_tokens)

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype append takes keys and values in (the buffers' here; a quantized cache's model dtype)."""
        return self.keys.dtype

    def _commit(self, k: torch.Tensor, v: torch.Tensor, new_tokens: torch.Tensor | None):
        """append after its checks: write k and v (already in the buffers' dtype), advance, and mask."""
        Lq = k.shape[2]
        self._write(self.keys, k)
        self._write(self.values, v)
        self.lengths.add_(Lq if new_tokens is None else new_tokens)
        if torch.compiler.is_compiling():
            keys, values = self.keys, self.values  # all M slots: static shapes, no recompiles
            self._filled, self._same_lengths = self.max_len, False  # the host no longer knows the lengths
        else:
            self._filled += Lq
            self._same_lengths = self._same_lengths and new_tokens is None
            keys, values = self.keys[:, :, :self._filled], self.values[:, :, :self._filled]
            if self._same_lengths:  # every sequence fills the grid: bottom-right causal says it all
                return keys, values, BOTTOM_RIGHT
        # the lengths give each sequence its own bottom-right alignment (a copy: the cache moves on)
        return keys, values, Mask.lengths(self.lengths.clone(), new_tokens) & BOTTOM_RIGHT

    def _write(self, buffer: torch.Tensor, new: torch.Tensor) -> None:
        """Copy new (B, Hkv, Lq, D) into buffer after each sequence's length (lengths not yet advanced).

        Eager, the host knows where to write when every sequence has the same length, or on the CPU
        where reading lengths is free: plain slice copies. Otherwise (compiled, or ragged on a device)
        one scatter along the positions, with no host sync. (CPU scatter in bf16/fp16 is very slow,
        which is why it is the last resort.)
        """
        Lq = new.shape[2]
        if not torch.compiler.is_compiling():
            if self._same_lengths:
                buffer[:, :, self._filled:self._filled + Lq] = new
                return
            if values_checkable(self.lengths):
                for b, start in enumerate(self.lengths.tolist()):
                    buffer[b, :, start:start + Lq] = new[b]
                return
        pos = self.lengths[:, None] + torch.arange(Lq, device=new.device)  # (B, Lq) slots to write
        buffer.scatter_(2, pos[:, None, :, None].expand_as(new), new)

    def positions(self, Lq: int) -> torch.Tensor:
        """(B, Lq) absolute positions of the next Lq tokens of each sequence (for RoPE)."""
        return self.lengths[:, None] + torch.arange(Lq, device=self.lengths.device)

    def _check(self, k, v, new_tokens) -> None:
        """AttentionError, before anything is written, for any call the cache cannot take."""
        B, Hkv, M, D = self.keys.shape
        Dv = self.values.shape[-1]
        for name, t, width in (("keys", k, D), ("values", v, Dv)):
            if t.dim() != 4 or t.shape[0] != B or t.shape[1] != Hkv or t.shape[3] != width:
                raise AttentionError(
                    f"cache {name} must be (B={B}, Hkv={Hkv}, L, {width}); got {shape_str(t.shape)}.")
            if t.dtype != self.input_dtype or t.device != self.keys.device:
                raise AttentionError(
                    f"cache holds {self.input_dtype} on {self.keys.device}; got {name} {t.dtype} on {t.device}.")
        Lq = k.shape[2]
        if v.shape[2] != Lq:
            raise AttentionError(f"keys and values must add the same number of tokens; got {Lq} and {v.shape[2]}.")
        if new_tokens is not None:
            if tuple(new_tokens.shape) != (B,) or new_tokens.dtype in (torch.bool,) or new_tokens.is_floating_point():
                raise AttentionError(f"new token counts must be integers of shape (B={B},); got {_describe(new_tokens)}.")
            if values_checkable(new_tokens) and not bool(((new_tokens >= 0) & (new_tokens <= Lq)).all()):
                raise AttentionError(f"new token counts must lie in [0, {Lq}]; got {new_tokens.tolist()}.")
        if torch.compiler.is_compiling():
            # The lengths live in the graph, not on the host: a device-side assertion checks them with
            # no host sync. It runs before the writes, and fails the compiled call with a RuntimeError
            # carrying this message (a graph cannot raise AttentionError).
            if B:
                torch._assert_async(self.lengths.max() + Lq <= M, f"{OVERFLOW} (max_len={M})")
            return
        if values_checkable(self.lengths):
            longest = int(self.lengths.max()) if B else 0
        else:
            longest = self._filled
        if longest + Lq > M:
            raise AttentionError(
                f"the cache holds up to max_len={M} tokens per sequence; writing {Lq} more after "
                f"{longest} would pass it. Make a larger cache with new_cache(batch_size, max_len).")


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} of shape {shape_str(t.shape)}"
    return f"{type(t).__name__}"
