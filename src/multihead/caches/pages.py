"""Paging: the page pool of a paged cache, its block table, and sequences that come, go and share pages.

Shape legend: B sequences, P pages in the pool, S page_size, N pages per sequence (ceil(max_len / S)).

    cache = layer.new_cache(B, max_len, page_size=16)    # key_pages (P, Hkv, S, D), block_table (B, N), lengths (B,)
    b = cache.add_sequence()      # a row for a new sequence: a released one, else the batch grows by one
    cache.fork(src, b)            # b starts with src's tokens: the same pages, by reference
    cache.release(b)              # b is empty again; pages no sequence refers to go back to the pool

A page's reference count is how many block-table entries point at it (`page_refs()`): counted from the
table, never kept beside it, so a fork, a reorder (beam search) or a release cannot make it wrong. A write
into a page that another sequence also refers to first copies that page (copy on write): a fork shares
even a last, partial page, and whichever sequence writes into it first gets a copy of its own. New pages
are zeroed. The table is managed on the host: each write reads the lengths and the table (on an
accelerator that is a sync per step; the block-table bookkeeping of a serving engine lives there too).
"""
from __future__ import annotations

import torch

from multihead.backends.kv_forms import Paged
from multihead.errors import AttentionError


def materialized(self):
        return self.cache.read(self.part, self.stop)


def materialized(view):
    """A tensor (or Quantized) for any view a cache hands out (a Paged view gathered)."""
    return view.gathered() if isinstance(view, Paged) else view


class Paging:
    """The paged storage's operations, mixed into caches.base.Cache (which calls them when page_size is set)."""

    def page_refs(self) -> torch.Tensor:
        """(P,) int64: how many block-table entries refer to each page (0: free)."""
        if not self.paged:
            raise AttentionError("page_refs: this cache is contiguous (new_cache(..., page_size=S) makes pages).")
        table = self.block_table[self.block_table >= 0].long()
        return torch.bincount(table.cpu(), minlength=self._pool()).to(self.block_table.device)

    def pages_in_use(self) -> int:
        return int((self.page_refs() > 0).sum()) if self.paged else 0

    def _pool(self) -> int:
        return getattr(self, self.parts[0].pages).shape[0]

    def _pooled(self) -> list[str]:
        return [n for p in self.parts for n in (p.pages, p.scales) if hasattr(self, n)]

    def _gathered(self, name: str, stop: int, first_page: int = 0) -> torch.Tensor:
        """Slots first_page * S <= t < stop of every sequence of buffer `name`, (B, h, stop - first_page * S, ...),
        read through the block table. A FALLBACK that gathers pages into a contiguous copy, until a paged
        backend reads them in place."""
        pages = getattr(self, name)
        n = -(-stop // self.page_size)
        table = self.block_table[:, first_page:n].clamp(min=0).long()  # -1 (no page) reads page 0: masked out
        rows = pages[table]  # (B, n - first_page, h, S, ...)
        B, m, h, S = rows.shape[:4]
        return rows.transpose(1, 2).reshape(B, h, m * S, *rows.shape[4:])[:, :, :stop - first_page * S]

    def _pages_as_read(self, part) -> tuple[torch.Tensor, torch.Tensor | None]:
        """A part's pages (P, h, S, w) as a paged kernel reads them (fp8 codes as float8_e4m3fn) and its scales."""
        pages = getattr(self, part.pages)
        if self.kv_dtype is torch.float8_e4m3fn and part.coded:
            pages = pages.view(torch.float8_e4m3fn)
        return pages, getattr(self, part.scales, None)

    def _plan_pages(self, Lq: int, new_tokens: torch.Tensor | None):
        """Give every sequence the pages its next tokens need (fresh pages, or copies of shared ones) and say
        where each real token goes: (sequence, token, page, slot) index tensors. Refuses, before any change,
        when the pool is short of pages."""
        S, table = self.page_size, self.block_table.tolist()
        lengths = self.lengths.tolist()
        counts = [Lq] * len(lengths) if new_tokens is None else new_tokens.tolist()
        refs = self.page_refs().tolist()
        wanted = []  # (sequence, page index in its row, page to copy from or -1)
        for b, (start, n) in enumerate(zip(lengths, counts)):
            for i in range(start // S, -(-(start + n) // S)) if n else ():
                page = table[b][i]
                if page < 0 or refs[page] > 1:  # the last holder of a shared page then writes it in place
                    wanted.append((b, i, page))
                    refs[page] -= page >= 0
        free = [p for p, r in enumerate(self.page_refs().tolist()) if r == 0]
        if len(wanted) > len(free):
            raise AttentionError(f"the page pool has {len(free)} free pages of {S} tokens; this call needs "
                                 f"{len(wanted)}. Release finished sequences, or make the cache with more pages "
                                 "(new_cache(..., num_pages=)).")
        for (b, i, old), new in zip(wanted, free):
            for name in self._pooled():
                buffer = getattr(self, name)
                buffer[new] = 0 if old < 0 else buffer[old]
            table[b][i] = new
        if wanted:
            self.block_table.copy_(torch.tensor(table, dtype=torch.int32))
        seq, tok = zip(*[(b, t) for b, n in enumerate(counts) for t in range(n)]) if any(counts) else ((), ())
        pos = [lengths[b] + t for b, t in zip(seq, tok)]
        page = [table[b][p // S] for b, p in zip(seq, pos)]
        device = self.lengths.device
        return tuple(torch.tensor(x, dtype=torch.long, device=device) for x in (seq, tok, page, [p % S for p in pos]))

    def fork(self, src: int, dst: int, length: int | None = None) -> None:
        """Sequence dst starts with the first `length` tokens of src (default: all): src's pages, shared by
        reference (paged; a contiguous cache copies the slots). dst's own tokens are dropped first."""
        for b in (src, dst):
            self._check_sequence(b, "fork")
        held = int(self.lengths[src])
        length = held if length is None else length
        if isinstance(length, bool) or not isinstance(length, int) or not 0 <= length <= held or src == dst:
            raise AttentionError(f"fork expects two different sequences and a length in [0, {held}] (what "
                                 f"sequence {src} holds); got src={src}, dst={dst}, length={length!r}.")
        if self.paged:
            n = -(-length // self.page_size)
            self.block_table[dst] = -1
            self.block_table[dst, :n] = self.block_table[src, :n]
        else:
            for buf in self._per_sequence():
                if buf.dim() > 1:
                    buf[dst] = 0
                    buf[dst, :, :length] = buf[src, :, :length]
        self.lengths[dst] = length
        self._free_rows().discard(dst)
        self._same_lengths = False

    def add_sequence(self) -> int:
        """The row of a new, empty sequence: the lowest released one, else a new row (the batch grows by one).
        Feed it with the others, e.g. its prompt as a right-padded row (mask=Mask.lengths(n, query_lens=n))."""
        free = self._free_rows()
        if free:
            b = min(free)
            free.discard(b)
            return b
        if not self.pageable:
            raise AttentionError(f"a {type(self).__name__} holds every sequence at one length: it cannot add one.")
        pooled = set(self._pooled())
        for name, buf in list(self._buffers.items()):
            if name not in pooled:
                row = torch.full_like(buf[:1], -1 if name == "block_table" else 0)
                self._buffers[name] = torch.cat((buf, row))
        self._stepping, self._same_lengths = None, False
        return self.batch_size - 1

    def _free_rows(self) -> set[int]:
        return self.__dict__.setdefault("_released", set())
