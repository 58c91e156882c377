"""NormalForm: a Mask in the terms kernels take, folded once per (mask value, call) and read by every backend.

Shapes: B batch, H heads, Lq queries, Lk keys.

    causal / window / chunk   one alignment ("top_left", or "bottom_right": each sequence's last valid
                              query at its last valid key), and the bounds of the interval formula
                              (intervals.py): left, right (causal: 0) and chunk
    key_lens, query_lens      valid keys per sequence (B,) or per query (B, Lq); valid queries (B,)
    extents                   (query_lens or None, key_lens) (B,) when exactly one part gives them: what a
                              bottom-right alignment lines up
    segments                  query ids (B, Lq) and key ids (B, Lk): attend within the same id
    key_keep                  (B or 1, 1, 1, Lk) bool: keys some query may see, when parts block whole keys
    slopes, alibi_align       ALiBi: adds slopes[h] * (j - p) to the scores
    residual                  the parts no slot takes (dense keeps, offsets, user functions, and positional
                              parts whose alignment disagrees with the first): only a dense or scored
                              form expresses them (correct everywhere, fast nowhere in particular)

Each part says where it goes (`Part.fold`) by one call on a `Fold`; the dense and point forms (SDPA's
mask, Flex's mask_mod and score_mod, the reference math) still evaluate every part's own keep, bias
and score in part order, so folding never changes what a mask means. A new slot is a field here and a
method on Fold; a new mask kind that fills an existing slot, or none, touches only its own file.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from multihead.masks.index import Index
from multihead.masks.intervals import at_least, at_most, bounds
from multihead.masks.part import Part

HOST_ROWS = 64  # at most this many query rows: a decode step's intervals are worked out on host ints


@dataclass(frozen=True, eq=False)
class NormalForm:
    """What kernels take from a mask; see the module docstring. Every field is a fact, read, never computed."""

    parts: tuple[Part, ...] = ()
    align: str = "top_left"
    left: int | None = None
    right: int | None = None
    chunk: int | None = None
    positional: tuple[Part, ...] = ()  # the parts folded into align / left / right / chunk
    causal_parts: tuple[Part, ...] = ()  # folded parts that are exactly `right = 0` (SDPA's is_causal)
    causal: bool = False  # some part is a causal term, folded or not
    key_lens: torch.Tensor | None = None
    query_lens: torch.Tensor | None = None
    lengths_parts: tuple[Part, ...] = ()
    extents: tuple[torch.Tensor | None, torch.Tensor] | None = None
    segments: tuple[torch.Tensor, torch.Tensor] | None = None
    segments_part: Part | None = None
    key_keep: torch.Tensor | None = None
    key_parts: tuple[Part, ...] = ()
    slopes: torch.Tensor | None = None
    alibi_align: str = "top_left"
    residual: tuple[Part, ...] = ()
    unaligned: tuple[Part, ...] = ()  # residual position terms (their alignment disagrees with the folded ones)
    score_parts: tuple[Part, ...] = ()  # residual parts that transform the scores (Mask.score_mod)
    calls_user: bool = False  # a part calls a user's function, which may read tensors the mask cannot see

    @property
    def scored(self) -> bool:
        """Whether a part transforms the scores (not an addition): every term then applies in part order."""
        return len(self.score_parts) > 0

    # ------------------------------------------------------------------ facts
    @property
    def key_only_lengths(self) -> bool:
        """Whether the lengths are (B,) with no padded queries: they block whole keys and nothing else."""
        return self.key_lens is not None and self.key_lens.dim() == 1 and self.query_lens is None

    @property
    def blocks_only_keys(self) -> bool:
        """Whether every term blocks whole keys (key padding, lengths (B,)) and none adds to the scores."""
        if len(self.positional) or self.segments is not None or len(self.residual) or self.slopes is not None:
            return False
        if self.key_lens is not None:
            return self.key_only_lengths
        return len(self.key_parts) > 0

    @property
    def intervals_only(self) -> bool:
        """Whether the keep is one interval of keys per query row (lengths, causal, window, chunks) and the only
        score term, if any, is one ALiBi: what a kernel taking (lo, hi) per row and slopes runs."""
        return len(self.residual) == 0 and self.segments is None and self.key_keep is None

    def slicer(self) -> tuple[Part, ...] | None:
        """The parts that cut rows into independent slices (lengths (B,), or segments), when exactly one kind does."""
        by_lengths = self.key_lens is not None and self.key_lens.dim() == 1
        if by_lengths == (self.segments is not None):
            return None
        return self.lengths_parts if by_lengths else (self.segments_part,)

    def causal_on(self, ix: Index) -> tuple[Part, ...]:
        """The parts SDPA takes as is_causal=True on grid `ix`: a folded top-left causal term on a plain grid
        (or bottom-right where queries and keys line up exactly)."""
        if len(self.causal_parts) == 0 or not ix.plain or any(p in ix.satisfied for p in self.causal_parts):
            return ()
        if self.align == "top_left":
            return self.causal_parts
        q_ext, k_ext = ix.q_extent, ix.k_extent
        if isinstance(q_ext, int) and isinstance(k_ext, int) and q_ext == k_ext == ix.Lq == ix.Lk:
            return self.causal_parts
        return ()

    # ------------------------------------------------------------------ grids and dense forms
    def index(self, B: int, H: int, Lq: int, Lk: int, device, rows_may_shift: bool = False) -> Index:
        """The whole (B, H, Lq, Lk) grid, with each sequence's extents when the form has them."""
        ix = Index.grid(B, H, Lq, Lk, device, rows_may_shift)
        if self.extents is None:
            return ix
        q_lens, k_lens = self.extents
        return ix.with_extents(Lq if q_lens is None else ix.per_batch(q_lens), ix.per_batch(k_lens))

    def dense(self, ix: Index, dtype: torch.dtype = torch.float32, skip=()) -> tuple:
        """(keep, bias) on the grid, each broadcastable to it or None; bias is finite `dtype` (summed in it)."""
        keep = bias = None
        for part in self.parts:
            if part in skip or part in ix.satisfied:
                continue
            k = part.keep(ix)
            if k is not None:
                keep = k if keep is None else keep & k
            b = part.bias(ix, dtype)
            if b is not None:
                bias = b if bias is None else bias + b
        if bias is not None:
            bias = bias.clamp_min(torch.finfo(bias.dtype).min)  # -1e9 in fp16 stays finite, never -inf
        return keep, bias

    def scores(self, s: torch.Tensor, ix: Index) -> torch.Tensor:
        """s (scaled, softcapped scores in the softmax dtype) after every part's score term, in part order."""
        for part in self.parts:
            if part not in ix.satisfied:
                s = part.score(s, ix)
        return s

    def score_terms(self, ix: Index, dtype: torch.dtype = torch.float32) -> tuple:
        """(keep, bias) as in `dense`, except that when a part transforms the scores, bias is the function
        scores -> `self.scores(scores, ix)` (applied in place of adding a bias)."""
        keep, bias = self.dense(ix, dtype)
        if self.scored:
            bias = functools.partial(self.scores, ix=ix)
        return keep, bias

    def key_visible(self, ix: Index) -> torch.Tensor | None:
        """(B or 1, 1, 1, Lk) bool: the keys some query may see, where terms block whole keys; else None.
        Keys outside it are made inert (zeroed) by the dense backends, so NaN stored there never reaches out."""
        visible = None if self.key_keep is None else ix.dense(self.key_keep)
        if self.key_lens is not None:
            longest = ix.k < ix.per_batch(self.longest_key_lens())  # (B, 1, 1, Lk)
            visible = longest if visible is None else visible & longest
        return visible

    def longest_key_lens(self) -> torch.Tensor:
        """(B,) keys any valid query of each row may see: the lengths, or their maximum over valid queries."""
        lens = self.key_lens
        if lens.dim() == 1:
            return lens
        Lq = lens.shape[1]
        if self.query_lens is not None:  # padded queries keep nothing, so their lengths do not count
            lens = lens.masked_fill(torch.arange(Lq, device=lens.device) >= self.query_lens[:, None], 0)
        return lens.amax(dim=1) if Lq else lens.new_zeros(lens.shape[0])

    # ------------------------------------------------------------------ the interval formula, two ways
    def row_intervals(self, ix: Index) -> tuple[torch.Tensor, torch.Tensor]:
        """(lo, hi), (B, Lq) int64 on the whole grid `ix`: query i of row b keeps keys lo <= j < hi.
        For a form that is `intervals_only` (the decode kernel's input); reads no values on the host.

        When every row's position is a host int (no per-sequence lengths) and the rows are few (a decode step),
        the formula runs on ints and one tensor is made at the end."""
        B, Lq, Lk = ix.B, ix.Lq, ix.Lk
        if self.key_lens is None and self.extents is None and Lq <= HOST_ROWS and not torch.compiler.is_compiling():
            offset = 0 if self.align == "top_left" else Lk - Lq
            los, his = zip(*(self._clamped(i + offset, None, Lk) for i in range(Lq)))  # per query row
            return (torch.tensor([los] * B, dtype=torch.long, device=ix.device),
                    torch.tensor([his] * B, dtype=torch.long, device=ix.device))  # (B, Lq) each
        key_len = None
        if self.key_lens is not None:
            key_len = self.key_lens[:, None] if self.key_lens.dim() == 1 else self.key_lens  # (B, 1) or (B, Lq)
            if self.query_lens is not None:  # padded queries keep nothing
                valid = torch.arange(Lq, device=ix.device) < self.query_lens[:, None]  # (B, Lq)
                key_len = torch.where(valid, key_len, 0)
        pos = ix.row_positions(self.align) if len(self.positional) else 0
        lo, hi = self._clamped(pos, key_len, Lk)
        return _rows(lo, B, Lq, ix.device), _rows(hi, B, Lq, ix.device)

    def _clamped(self, pos, key_len, Lk: int):
        """The interval formula's (lo, hi) for queries at `pos` (ints or tensors), within [0, Lk], hi >= lo."""
        lo, hi = bounds(pos, left=self.left, right=self.right, chunk=self.chunk, key_len=key_len)
        lo = at_most(at_least(lo, 0), Lk)
        return lo, at_least(at_most(hi, Lk), lo)  # an empty range stays empty

    def alibi_positions(self, ix: Index) -> torch.Tensor:
        """(B, Lq) float32: the query position ALiBi measures each distance from."""
        return ix.row_positions(self.alibi_align).float().contiguous()

    def span(self, q_lo: int, q_hi: int, Lq: int, Lk: int) -> tuple[int, int] | None:
        """Keys [lo, hi) that queries [q_lo, q_hi) of the whole grid may keep, as host ints, from the folded
        positional terms; None when the alignment differs per sequence (bottom-right with lengths)."""
        if q_hi <= q_lo:
            return 0, 0
        if len(self.positional) == 0:
            return 0, Lk
        if self.align == "top_left":
            offset = 0
        elif self.extents is None:
            offset = Lk - Lq
        else:
            return None
        lo, _ = self._clamped(q_lo + offset, None, Lk)  # the first row's (bounds grow with the position)
        _, hi = self._clamped(q_hi - 1 + offset, None, Lk)  # the last row's
        return lo, max(lo, hi)


def _rows(bound, B: int, Lq: int, device) -> torch.Tensor:
    """A bound (int, (1, Lq), (B, 1) or (B, Lq)) as a contiguous (B, Lq) int64 tensor."""
    if isinstance(bound, int):
        return torch.full((B, Lq), bound, dtype=torch.long, device=device)
    return bound.to(torch.long).expand(B, Lq).contiguous()


class Fold:
    """What the parts of one mask say, gathered in part order (`Part.fold` calls one method each)."""

    LISTS = ("positional", "causal_parts", "lengths_parts", "extents", "key_parts", "residual", "unaligned",
             "score_parts")

    def __init__(self, parts: tuple[Part, ...]):
        self.parts = parts
        self.slots: dict = {}  # NormalForm's single-valued fields, as they are found
        self.folded: dict = {name: [] for name in self.LISTS}  # its tuples of parts

    def positional(self, part: Part, align: str, *, left: int | None = None, right: int | None = None,
                   chunk: int | None = None) -> None:
        """A position term: keys within [p - left, p + right] and in p's chunk, p aligned by `align`."""
        is_causal = right == 0 and left is None and chunk is None
        if is_causal:
            self.slots["causal"] = True
        s = self.slots
        folded = self.folded
        disagrees = align != s.get("align", align) or chunk is not None and s.get("chunk") not in (None, chunk)
        if len(folded["positional"]) and disagrees:
            folded["residual"].append(part)  # disagrees with the terms folded so far: evaluated densely
            folded["unaligned"].append(part)
            return
        s["align"] = align
        if left is not None:
            s["left"] = left if s.get("left") is None else min(left, s["left"])
        if right is not None:
            s["right"] = right if s.get("right") is None else min(right, s["right"])
        if chunk is not None:
            s["chunk"] = chunk
        folded["positional"].append(part)
        if is_causal:
            folded["causal_parts"].append(part)

    def lengths(self, part: Part, key_lens: torch.Tensor, query_lens: torch.Tensor | None) -> None:
        """Valid keys (B,) or (B, Lq) per sequence; valid queries (B,) or None."""
        if key_lens.dim() == 1:
            self.folded["extents"].append((query_lens, key_lens))
        s = self.slots
        if "key_lens" in s:  # a second lengths part: the tighter of both, per sequence (and per query)
            a, b = s["key_lens"], key_lens
            if a.dim() != b.dim():
                a, b = (a[:, None], b) if a.dim() == 1 else (a, b[:, None])
            key_lens = torch.minimum(a, b)
            previous = s.get("query_lens")
            query_lens = previous if query_lens is None else (
                query_lens if previous is None else torch.minimum(previous, query_lens))
        s["key_lens"], s["query_lens"] = key_lens, query_lens
        self.folded["lengths_parts"].append(part)

    def segments(self, part: Part, query_ids: torch.Tensor, key_ids: torch.Tensor) -> None:
        """Packed sequences: query ids (B, Lq), key ids (B, Lk)."""
        if "segments" in self.slots:
            self.folded["residual"].append(part)
            return
        self.slots["segments"], self.slots["segments_part"] = (query_ids, key_ids), part

    def key_keep(self, part: Part, keep: torch.Tensor) -> None:
        """A keep of whole keys, (B or 1, 1, 1, Lk) bool."""
        previous = self.slots.get("key_keep")
        self.slots["key_keep"] = keep if previous is None else previous & keep
        self.folded["key_parts"].append(part)

    def alibi(self, part: Part, slopes: torch.Tensor, align: str) -> None:
        """ALiBi slopes (H,), distances measured from the query position under `align`."""
        if "slopes" in self.slots:
            self.folded["residual"].append(part)
            return
        self.slots["slopes"], self.slots["alibi_align"] = slopes, align

    def residual(self, part: Part, *, scores: bool = False, calls_user: bool = False) -> None:
        """A term only the dense or scored form expresses. scores: it transforms the scores (not an addition);
        calls_user: it calls a user's function."""
        self.slots["calls_user"] = self.slots.get("calls_user", False) or calls_user
        self.folded["residual"].append(part)
        if scores:
            self.folded["score_parts"].append(part)

    def finish(self) -> NormalForm:
        s, folded = dict(self.slots), {name: tuple(parts) for name, parts in self.folded.items()}
        extents = folded.pop("extents")
        return NormalForm(parts=self.parts, causal=s.pop("causal", False),
                          extents=extents[0] if len(extents) == 1 else None, **folded, **s)


def normal_form(parts: tuple[Part, ...]) -> NormalForm:
    """Fold `parts` (in order) into their normal form."""
    form = Fold(tuple(parts))
    for part in form.parts:
        part.fold(form)
    return form.finish()


EMPTY = NormalForm()
