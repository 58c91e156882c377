"""Index: the grid a mask is evaluated on, as broadcastable index tensors.

Every mask kind is written once, as a function of four indices, the way FlexAttention's mask_mod
sees it:

    b  batch row          (B, 1, 1, 1), or one row, or a scalar
    h  head               (1, H, 1, 1)
    q  query position     (1, 1, Lq, 1)
    k  key position       (1, 1, 1, Lk)

Evaluated on the whole grid (`Index.grid`), the result broadcasts to (B, H, Lq, Lk): the dense form
every backend can use. Evaluated on one sequence's valid slice (`Index.slice`) it is the mask the
length-aware backend needs; evaluated on scalars it is a Flex mask_mod.

Extents are the valid queries and keys of each sequence (from `Mask.lengths`, else Lq and Lk). A
bottom-right alignment lines up each sequence's last valid query with its last valid key, so a
decoder with a KV cache attends causally to its own cached length.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(eq=False)
class Index:
    """Broadcastable index tensors of one evaluation grid; see the module docstring."""

    b: torch.Tensor | int | None
    h: torch.Tensor | None
    q_pos: torch.Tensor | None  # None: 0..Lq-1, made on first use (most masks never need positions)
    k_pos: torch.Tensor | None
    Lq: int  # the number of queries and keys on this grid
    Lk: int
    q_extent: torch.Tensor | int  # valid queries per sequence: (B, 1, 1, 1) or int
    k_extent: torch.Tensor | int  # valid keys per sequence
    whole: bool = True  # b, h, q, k cover the whole grid in order: dense tensors apply as they are
    plain: bool = True  # q and k are positions 0..Lq-1 and 0..Lk-1 (the whole grid or one slice)
    key_run: bool = True  # k is one run of consecutive key positions (the whole grid, a slice or a block)
    satisfied: tuple = ()  # parts that keep every entry of this grid (the parts that cut it out)
    rows_may_shift: bool = False  # the consumer's softmax ignores per-row constants (no sinks)
    device: torch.device | str | None = None
    B: int | None = None  # batch rows and heads of the whole grid, where b or h is None (all of them)
    H: int | None = None

    @classmethod
    def grid(cls, B: int, H: int, Lq: int, Lk: int, device, rows_may_shift: bool = False) -> Index:
        """The whole (B, H, Lq, Lk) grid; extents start as Lq and Lk (Mask.index narrows them)."""
        return cls(None, None, None, None, Lq, Lk, Lq, Lk, rows_may_shift=rows_may_shift, device=device, B=B, H=H)

    @classmethod
    def slice(cls, b: int, q_lo: int, q_hi: int, k_lo: int, k_hi: int, q_extent, k_extent, satisfied: tuple,
              device, H: int | None = None, rows_may_shift: bool = False) -> Index:
        """Row b's queries [q_lo, q_hi) and keys [k_lo, k_hi), cut out by the parts in `satisfied`.

        Positions stay absolute; extents are the row's (ints). The grid is plain when both spans start
        together, so a causal mask on it is SDPA's own. rows_may_shift: as in `grid`.
        """
        q = torch.arange(q_lo, q_hi, device=device).view(1, 1, -1, 1)
        k = torch.arange(k_lo, k_hi, device=device).view(1, 1, 1, -1)
        return cls(b, None, q, k, q_hi - q_lo, k_hi - k_lo, q_extent, k_extent, whole=False, plain=q_lo == k_lo,
                   satisfied=satisfied, rows_may_shift=rows_may_shift, device=device, H=H)

    @classmethod
    def point(cls, b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor, Lq: int, Lk: int,
              extents=None) -> Index:
        """Entry (b, h, q_idx, kv_idx) of the (B, H, Lq, Lk) grid, as Flex's mask_mod and score_mod see it.

        The indices are scalar tensors there (any tensors that broadcast together work: the results
        broadcast like them). extents: the mask's (query_lens (B,) or None, key_lens (B,)), read at
        row b, as `Mask.index` does on the whole grid.
        """
        ix = cls(b, h, q_idx, kv_idx, Lq, Lk, Lq, Lk, whole=False, plain=False, key_run=False, device=q_idx.device)
        if extents is None:
            return ix
        q_lens, k_lens = extents
        return ix.with_extents(Lq if q_lens is None else ix.per_batch(q_lens), ix.per_batch(k_lens))

    @property
    def q(self) -> torch.Tensor:
        """Query positions, (1, 1, Lq, 1) on a plain grid."""
        if self.q_pos is None:
            self.q_pos = torch.arange(self.Lq, device=self.device).view(1, 1, -1, 1)
        return self.q_pos

    @property
    def k(self) -> torch.Tensor:
        """Key positions, (1, 1, 1, Lk) on a plain grid."""
        if self.k_pos is None:
            self.k_pos = torch.arange(self.Lk, device=self.device).view(1, 1, 1, -1)
        return self.k_pos

    def indices(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(b, h, q, k) as integer tensors that broadcast together to this grid (FlexAttention's indices).

        Whole grid: (B, 1, 1, 1), (1, H, 1, 1), (1, 1, Lq, 1), (1, 1, 1, Lk); a slice or a block keeps its
        row and absolute positions; a Flex point passes its scalar tensors through.
        """
        b, h = self.b, self.h
        if b is None or isinstance(b, int):
            b = torch.arange(self.B, device=self.device) if b is None else torch.full((1,), b, device=self.device)
            b = b.view(-1, 1, 1, 1)
        if h is None:
            if self.H is None:
                raise ValueError("this grid does not know its heads; build slices with Index.slice(..., H=H)")
            h = torch.arange(self.H, device=self.device).view(1, -1, 1, 1)
        return b, h, self.q, self.k

    def block(self, q_lo: int, q_hi: int, k_lo: int, k_hi: int) -> Index:
        """Queries [q_lo, q_hi) and keys [k_lo, k_hi) of this whole grid: absolute positions, same extents."""
        q = torch.arange(q_lo, q_hi, device=self.device).view(1, 1, -1, 1)
        k = torch.arange(k_lo, k_hi, device=self.device).view(1, 1, 1, -1)
        return replace(self, q_pos=q, k_pos=k, Lq=q_hi - q_lo, Lk=k_hi - k_lo, whole=False, plain=False)

    def with_extents(self, q_extent, k_extent) -> Index:
        return replace(self, q_extent=q_extent, k_extent=k_extent)

    def query_position(self, align: str) -> torch.Tensor:
        """Query positions shifted for the alignment: (.., Lq, 1), per sequence when extents are."""
        if align == "top_left":
            return self.q
        return self.q + (self.k_extent - self.q_extent)

    def row_positions(self, align: str) -> torch.Tensor:
        """`query_position` on the whole grid as one position per (batch row, query): (B, Lq)."""
        return self.query_position(align).reshape(-1, self.Lq).expand(self.B, self.Lq)

    # ---------------------------------------------------------------- reading per-sequence tensors
    def per_batch(self, t: torch.Tensor) -> torch.Tensor:
        """A (B,) tensor at this grid's batch rows: (B, 1, 1, 1) on the whole grid."""
        return self.dense(t.view(-1, 1, 1, 1))

    def per_query(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, Lq) tensor at this grid's rows and queries: (B, 1, Lq, 1) on the whole grid."""
        return self.dense(t[:, None, :, None])

    def per_key(self, t: torch.Tensor) -> torch.Tensor:
        """A (B, Lk) tensor at this grid's rows and keys: (B, 1, 1, Lk) on the whole grid."""
        return self.dense(t[:, None, None, :])

    def dense(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor broadcastable to (B, H, Lq, Lk), read at this grid's indices (size-1 dims broadcast).

        Only the dims the tensor has are indexed: the size-1 ones are dropped first, so no index is a
        0-dim tensor (torch.compile would read one as a number, and vmap cannot mix them with its own).
        """
        if self.whole:
            return t
        t4 = t.view((1,) * (4 - t.dim()) + tuple(t.shape))
        axes = [axis for axis in range(4) if t4.shape[axis] != 1]
        grid = (lambda: self.b, lambda: self.h, lambda: self.q, lambda: self.k)
        if not axes:  # a single value: nothing to index (t[()] fails under Flex's vmap)
            return t4.reshape(()) if self.q.dim() == 0 else t4  # a Flex point is 0-dim; other grids 4-dim
        index = tuple(_axis_index(t4.shape[axis], grid[axis](), axis, t4.device) for axis in axes)
        return t4.reshape([t4.shape[axis] for axis in axes])[index]


def _axis_index(size: int, i, axis: int, device) -> torch.Tensor:
    """The index tensor for one axis of the grid: its indices, or all of 0..size-1 along that axis."""
    if i is None:
        shape = [1, 1, 1, 1]
        shape[axis] = size
        return torch.arange(size, device=device).view(shape)
    if isinstance(i, int):  # a slice's row: 4-dim, so the result keeps the grid's 4 dims even when it is alone
        return torch.full((1, 1, 1, 1), i, device=device)
    return torch.as_tensor(i, device=device)
