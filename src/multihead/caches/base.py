"""Cache: what every cache kind shares (storage, per-sequence lengths, positions, reset, reorder, release, the
capacity check and the check of a layer's call); what differs is data: a layout's parts, a codec, a storage.

Shape legend: B batch, h a part's heads, M max_len, w a part's width, Lq new tokens, P pages, S page_size.

    Cache(B, M, (Part("keys", Hkv, D), Part("values", Hkv, Dv)), codec=codec_for(None, torch.bfloat16))
        contiguous: keys (B, Hkv, M, D) ...; page_size=S: key_pages (P, Hkv, S, D) ..., block_table (caches/pages.py)

A quantized codec adds fp32 scales beside each part: (B, h, M) or (P, h, S), (..., 2) for a split part. Writes go
after each sequence's own length; attention reads the slots causally aligned bottom-right per sequence. A call
that cannot be done raises AttentionError and changes nothing. Compiled (contiguous), the cache attends over all
M slots (static shapes) and the capacity check is a device-side assertion; in eager, up to the longest sequence.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from multihead.backends.kv_forms import Paged
from multihead.caches.codec import Codec, Quantized
from multihead.caches.pages import Paging
from multihead.errors import AttentionError, shape_str
from multihead.masks import Mask
from multihead.masks.values import values_checkable

BOTTOM_RIGHT = Mask.causal("bottom_right")  # every sequence's new tokens line up with its last cached ones
OVERFLOW = "the KV cache has no room for these tokens: make a larger cache with new_cache(batch_size, max_len)"


class Part(NamedTuple):
    """One tensor a token leaves: buffer `name` (B, heads, M, width), or `pages` (P, heads, S, width), with fp32
    `scales` when quantized (two per row with split); coded=False: in the model's dtype whatever the codec."""
    name: str
    heads: int
    width: int
    pages: str = ""
    scales: str = ""
    split: int | None = None
    coded: bool = True


def positive(owner: str, **sizes) -> None:
    """AttentionError unless every size is a positive int."""
    for name, n in sizes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise AttentionError(f"{owner} {name} must be a positive int; got {n!r}.")


class Cache(Paging, nn.Module):
    """The cache family's base: per-part buffers (contiguous or paged), lengths (B,), a codec."""

    pageable = True  # takes page_size= and int8/fp8 codecs (a kind with a form of its own says False)

    def __init__(self, batch_size: int, max_len: int, parts: tuple[Part, ...], *, codec: Codec,
                 page_size: int | None = None, num_pages: int | None = None, slots: int | None = None, device=None):
        super().__init__()
        positive(type(self).__name__, batch_size=batch_size, max_len=max_len)
        if page_size is not None:
            positive(type(self).__name__, page_size=page_size, num_pages=num_pages or 1)
        self.parts, self.codec, self.page_size, self._max_len = tuple(parts), codec, page_size, max_len
        B, M, S = batch_size, max_len if slots is None else slots, page_size
        lead = (B,) if S is None else (num_pages or B * -(-max_len // S),)  # sequences, or the pool's pages
        for p in self.parts:
            coded = p.coded and codec.quantized
            shape = (*lead, p.heads, M if S is None else S)
            self.register_buffer(p.name if S is None else p.pages, torch.zeros(
                *shape, p.width, device=device, dtype=codec.stored if p.coded else codec.dtype))
            if coded:
                self.register_buffer(p.scales, torch.zeros(*shape, *(() if p.split is None else (2,)), device=device))
        if S is not None:
            self.register_buffer("block_table", torch.full((B, -(-max_len // S)), -1, dtype=torch.int32,
                                                           device=device))
        self.register_buffer("lengths", torch.zeros(B, dtype=torch.long, device=device))
        self._filled = 0  # eager only: an upper bound on every length, known on the host without a sync
        self._same_lengths = True  # eager only: every sequence has exactly `_filled` tokens
        self._stepping = None  # (lengths copy, mask): the decode step's mask, one object across steps

    # ------------------------------------------------------------------ what the cache is
    max_len = property(lambda self: self._max_len)
    batch_size = property(lambda self: self.lengths.shape[0])

    @property
    def held(self) -> int:
        """Slots in use (the longest sequence's length, known on the host in eager; max_len once compiled)."""
        return self._filled

    @property
    def kv_dtype(self) -> torch.dtype | None:
        """int8 or float8_e4m3fn for a quantized cache; None for a float one."""
        return self.codec.kv_dtype

    @property
    def input_dtype(self) -> torch.dtype:
        """The dtype the cache takes new keys and values in (the model's)."""
        return self.codec.dtype

    paged = property(lambda self: self.page_size is not None)
    pages_in_place = False  # a layout whose layer hands its views to attention whole: paged views stay pages

    def positions(self, Lq: int) -> torch.Tensor:
        """(B, Lq) absolute positions of the next Lq tokens of each sequence (for RoPE)."""
        return self.lengths[:, None] + torch.arange(Lq, device=self.lengths.device)

    def bytes_per_token(self) -> int:
        """What one token costs this cache per layer: every part's numbers and, quantized, their fp32 scales."""
        size = {True: self.codec.stored.itemsize, False: self.codec.dtype.itemsize}
        return sum(p.heads * (p.width * size[p.coded] + 4 * (p.coded and self.codec.quantized)
                              * (1 if p.split is None else 2)) for p in self.parts)

    def memory_bytes(self) -> int:
        """Bytes held for tokens: a contiguous cache's buffers (all M slots), a paged cache's pages in use."""
        if not self.paged:
            return sum(getattr(self, n).nbytes for p in self.parts for n in (p.name, p.scales) if hasattr(self, n))
        return self.pages_in_use() * self.page_size * self.bytes_per_token()

    def extra_repr(self) -> str:
        first, lengths = self.parts[0], self.lengths
        held = str(lengths.tolist()) if values_checkable(lengths) and len(lengths) <= 8 else \
            f"{shape_str(lengths.shape)} on {lengths.device}"
        paged = "" if not self.paged else f", page_size={self.page_size}, pages={self.pages_in_use()}/" \
                                          f"{getattr(self, first.pages).shape[0]}"
        return (f"batch_size={self.batch_size}, heads={first.heads}, max_len={self.max_len}, "
                f"dtype={self.codec.dtype}, codec={self.codec!r}{paged}, lengths={held}")

    # ------------------------------------------------------------------ checks
    def check_call(self, mask, batch: int, heads: int, width: int, self_attention: bool = True):
        """A layer's call, checked before anything is computed: this cache's batch and first part's heads and
        width, self-attention, and a mask that may only be Mask.lengths(lens, query_lens=lens) (a right-padded
        prompt). Returns the per-sequence count of real new tokens (None: all Lq)."""
        if not self_attention:
            raise AttentionError("a KV cache holds a decoder's own keys: pass only the query (self-attention).")
        first = self.parts[0]
        if (self.batch_size, first.heads, first.width) != (batch, heads, width):
            raise AttentionError(f"the cache is for batch {self.batch_size}, {first.heads} kv heads of size "
                                 f"{first.width}; this call has batch {batch}, {heads} kv heads of size {width}.")
        if mask is None:
            return None
        extents = mask.normal_form().extents if isinstance(mask, Mask) else None
        if extents is None or len(mask.parts) != 1:
            raise AttentionError("with a cache, mask may only be Mask.lengths(lens, query_lens=lens) (a right-padded "
                                 f"prompt); got {mask!r}. The cache makes the attention causal by itself.")
        q_lens, k_lens = extents
        return k_lens if q_lens is None else q_lens

    def check_room(self, Lq: int) -> None:
        """AttentionError (eager) or a device-side assertion (compiled) unless Lq more tokens fit every sequence."""
        M = self.max_len
        if torch.compiler.is_compiling():
            # the lengths live in the graph: checked with no host sync, before the writes; a compiled call
            # fails with a RuntimeError carrying this message (a graph cannot raise AttentionError)
            if self.batch_size:
                torch._assert_async(self.lengths.max() + Lq <= M, f"{OVERFLOW} (max_len={M})")
            return
        longest = int(self.lengths.max()) if values_checkable(self.lengths) and self.batch_size else self._filled
        if longest + Lq > M:
            raise AttentionError(f"the cache holds up to max_len={M} tokens per sequence; writing {Lq} more after "
                                 f"{longest} would pass it. Make a larger cache with new_cache(batch_size, max_len).")

    def _check_new(self, new: tuple[torch.Tensor, ...], new_tokens: torch.Tensor | None) -> None:
        """AttentionError, before anything is written, for new rows (B, heads, Lq, width) per part the cache
        cannot take."""
        B, Lq = self.batch_size, new[0].shape[2] if new[0].dim() == 4 else -1
        for p, t in zip(self.parts, new):
            if t.dim() != 4 or t.shape[0] != B or t.shape[1] != p.heads or t.shape[3] != p.width:
                raise AttentionError(f"cache {p.name} must be (B={B}, Hkv={p.heads}, L, {p.width}); "
                                     f"got {shape_str(t.shape)}.")
            if t.dtype != self.input_dtype or t.device != self.lengths.device:
                raise AttentionError(f"cache holds {self.input_dtype} on {self.lengths.device}; got {p.name} "
                                     f"{t.dtype} on {t.device}.")
            if t.shape[2] != Lq:
                raise AttentionError(f"keys and values must add the same number of tokens; got {Lq} and "
                                     f"{t.shape[2]}.")
            if t.requires_grad and p.coded and self.codec.quantized:
                raise AttentionError("a quantized KV cache is for inference: its codes have no gradient; got keys or "
                                     "values that require grad (run under torch.no_grad() or use a float cache).")
        if new_tokens is not None:
            if tuple(new_tokens.shape) != (B,) or new_tokens.dtype is torch.bool or new_tokens.is_floating_point():
                raise AttentionError(f"new token counts must be integers of shape (B={B},); got {describe(new_tokens)}.")
            if values_checkable(new_tokens) and not bool(((new_tokens >= 0) & (new_tokens <= Lq)).all()):
                raise AttentionError(f"new token counts must lie in [0, {Lq}]; got {new_tokens.tolist()}.")
        self.check_room(Lq)

    # ------------------------------------------------------------------ writing and reading
    def store(self, new: tuple[torch.Tensor, ...], new_tokens: torch.Tensor | None = None):
        """Write each part's new rows (B, heads, Lq, width) after each sequence's tokens, then advance.

        new_tokens (B,): how many of the Lq tokens are real per sequence (right padding); default Lq.
        Returns (views, mask): per part what attention reads over the held slots (a tensor, or `Quantized`),
        and the Mask that makes the attention causal within each sequence's own length."""
        self._check_new(new, new_tokens)
        Lq = new[0].shape[2]
        first = self._filled == 0 and not torch.compiler.is_compiling()  # every slot read will be one of these
        plan = self._plan_pages(Lq, new_tokens) if self.paged else None  # may refuse: nothing written yet
        coded = [(i, p) for i, p in enumerate(self.parts) if p.coded and self.codec.quantized]
        encoded = list(zip(new, [None] * len(new)))
        if len({(new[i].shape, p.split) for i, p in coded}) == 1 and len(coded) > 1:  # one call for all
            codes, scales = self.codec.encode(torch.stack([new[i] for i, _ in coded]), coded[0][1].split)
            for n, (i, _) in enumerate(coded):
                encoded[i] = (codes[n], scales[n])
        else:
            for i, p in coded:
                encoded[i] = self.codec.encode(new[i], p.split)
        for p, (codes, scales) in zip(self.parts, encoded):
            self._write(p.name if plan is None else p.pages, codes, plan)
            if scales is not None:
                self._write(p.scales, scales, plan)
        self.lengths.add_(Lq if new_tokens is None else new_tokens)
        if torch.compiler.is_compiling():
            self._filled, self._same_lengths = self.max_len, False  # the host no longer knows the lengths
        elif self.paged:
            self._filled = int(self.lengths.max())
            self._same_lengths = bool((self.lengths == self._filled).all())
        else:
            self._filled += Lq
            self._same_lengths = self._same_lengths and new_tokens is None
        views = [self._attended(p) for p in self.parts]
        if first:  # a prompt into an empty cache: attention reads its float numbers (kv_forms.py: fresh)
            views = [v._replace(fresh=t) if isinstance(v, Quantized) else t if isinstance(v, Paged) and v.kv_dtype
                     else v for v, t in zip(views, new)]
        return views, self._mask(new_tokens)

    def _attended(self, part: Part):
        """What `store` hands attention of one part: `read`, or (eager, paged, a layout whose layer reads its views
        whole: `pages_in_place`) a Paged view of the pages and the block table, which dispatch reads in place in
        a decode step (backends/decode/paged.py) or gathers."""
        if not (self.paged and self.pages_in_place and part.split is None) or torch.compiler.is_compiling():
            return self.read(part)
        scales = getattr(self, part.scales) if part.coded and self.codec.quantized else None
        return Paged(getattr(self, part.pages), self.block_table, self._filled, scales,
                     self.codec.kv_dtype if scales is not None else None)

    def read(self, part: Part, stop: int | None = None):
        """What attention reads of one part over slots [0, stop) (default: the held ones): a tensor, or Quantized."""
        stop = self._filled if stop is None else stop
        if self.paged:
            codes = self._gathered(part.pages, stop)
            scales = self._gathered(part.scales, stop) if hasattr(self, part.scales) else None
        else:
            codes = getattr(self, part.name)[:, :, :stop]
            scales = getattr(self, part.scales)[:, :, :stop] if hasattr(self, part.scales) else None
        return self.codec.view(codes, scales, part.split) if part.coded else codes

    def _mask(self, new_tokens: torch.Tensor | None) -> Mask:
        """Bottom-right causal, per sequence's own length when they differ. A decode step's mask is one object
        over one lengths tensor updated in place, so that a plan keyed on the mask can hold across steps."""
        if self._same_lengths:
            return BOTTOM_RIGHT  # every sequence fills the grid: bottom-right causal says it all
        if new_tokens is not None or torch.compiler.is_compiling():
            return Mask.lengths(self.lengths.clone(), new_tokens) & BOTTOM_RIGHT  # a copy: the cache moves on
        kept = self._stepping
        if kept is None or kept[0].shape != self.lengths.shape or kept[0].device != self.lengths.device:
            with torch.inference_mode(False):  # a normal tensor: written in and out of inference mode alike
                lens = torch.zeros_like(self.lengths)
            kept = self._stepping = (lens, Mask.lengths(lens) & BOTTOM_RIGHT)
        kept[0].copy_(self.lengths)
        return kept[1]

    def _write(self, name: str, new: torch.Tensor, plan) -> None:
        """Copy new (B, h, Lq, ...) into buffer `name` after each sequence's length (lengths not yet advanced).

        Paged: through the plan's (sequence, token, page, slot) lists. Eager, the host knows where to write when
        every sequence has the same length, or on the CPU where reading lengths is free: plain slice copies.
        Otherwise (compiled, or ragged on a device) one scatter along the positions, with no host sync."""
        buffer = getattr(self, name)
        if plan is not None:
            b, t, page, slot = plan
            buffer[page, :, slot] = new[b, :, t]
            return
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
        pos = pos.view(*pos.shape[:1], 1, Lq, *([1] * (new.dim() - 3)))
        buffer.scatter_(2, pos.expand_as(new), new)

    # ------------------------------------------------------------------ whole-cache operations
    def _per_sequence(self) -> list[torch.Tensor]:
        """The buffers indexed by sequence first (a paged cache's pool is not)."""
        pooled = {n for p in self.parts for n in (p.pages, p.scales)} if self.paged else set()
        return [b for n, b in self.named_buffers() if n not in pooled]

    def reset(self) -> None:
        """Empty every sequence (the slots are zeroed, so stale values can never reach an output)."""
        for buf in self.buffers():
            buf.zero_()
        if self.paged:
            self.block_table.fill_(-1)
        self._filled, self._same_lengths = 0, True

    def reorder(self, index: torch.Tensor) -> None:
        """Beam search: sequence b becomes the old sequence index[b]. index: (B,) integers in [0, B).
        A paged cache moves block-table rows: sequences that now share pages copy a page when they write it."""
        B = self.batch_size
        if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int32, torch.int64) or \
                tuple(index.shape) != (B,):
            raise AttentionError(f"reorder expects an integer tensor of shape (B={B},); got {describe(index)}.")
        index = index.to(self.lengths.device)
        if values_checkable(index) and B and not bool(((index >= 0) & (index < B)).all()):
            raise AttentionError(f"reorder indices must lie in [0, {B}); got {index.tolist()}.")
        for buf in self._per_sequence():
            buf.copy_(buf.index_select(0, index))

    def release(self, b: int) -> None:
        """Empty sequence b (its slots zeroed, or its pages back to the pool); the others run on."""
        self._check_sequence(b, "release")
        for buf in self._per_sequence():
            buf[b] = -1 if buf is getattr(self, "block_table", None) else 0
        self._free_rows().add(b)
        self._same_lengths = self._same_lengths and self._filled == 0

    def _check_sequence(self, b, what: str) -> None:
        if not self.pageable:
            raise AttentionError(f"a {type(self).__name__} holds every sequence at one length: it cannot {what} one.")
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < self.batch_size:
            raise AttentionError(f"{what} expects a sequence index in [0, {self.batch_size}); got {b!r}.")


class Coded(type):
    """The metaclass of a quantized kind's old name (QuantizedKVCache): an instance is any cache of the parent
    kind whose codec is int8 or fp8, however it was made."""

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls.__bases__[0]) and obj.codec.quantized


def describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} of shape {shape_str(t.shape)}"
    return f"{type(t).__name__}"


def as_cache(cache, kind: type, where: str = "new_cache()") -> Cache:
    """`cache` itself when it is a `kind`; AttentionError otherwise."""
    if not isinstance(cache, kind):
        raise AttentionError(f"cache must be a {kind.__name__} from {where}; got {type(cache).__name__}.")
    return cache
