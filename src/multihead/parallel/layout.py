"""Which positions of a sequence each rank holds: the layout, "contiguous" or "zigzag".

Shapes: B batch, H heads, N global sequence length, P ranks, L_r the positions rank r holds.

    layout="contiguous"   the sequence cut into P chunks,   rank r holds chunk r
    layout="zigzag"       the sequence cut into 2P chunks,  rank r holds chunks r and 2P-1-r (its mirror)

The layout is always named by the caller (shard_sequence, unshard_sequence, ring_attention and
ulysses_attention take the same required `layout=`); it never follows from `causal`. Both layouts
give exact results for every mask; they differ in balance. Under a causal mask the early chunks
see few keys and the late ones many; pairing chunk r with chunk 2P-1-r gives every rank the same
amount of work (with the contiguous layout the last rank does nearly 2P-1 times the work of rank 0).
Chunk sizes follow `torch.tensor_split`: when N does not divide evenly, the first chunks are one
position longer, so shards may differ by a position or two, and every rank can still work out
every other rank's positions from N alone.

`shard_sequence` cuts a full tensor into this rank's shard; `unshard_sequence` gathers the shards
back into the full tensor in position order.
"""
from __future__ import annotations

import torch

from multihead.errors import AttentionError
from multihead.parallel.comm import all_gather_uneven, group_rank, group_size, resolve_group
from multihead.parallel.validation import agree, dtype_code

Segment = tuple[int, int]  # global positions [start, end)
MAX_DIMS = 8
LAYOUTS = ("contiguous", "zigzag")


def check_layout(layout, who: str) -> str:
    """`layout` if it is "contiguous" or "zigzag"; AttentionError otherwise."""
    if not isinstance(layout, str) or layout not in LAYOUTS:
        raise AttentionError(f"{who}: layout must be \"contiguous\" or \"zigzag\" (how the sequence was cut into "
                             f"shards; zig-zag balances causal work); got {layout!r}.")
    return layout


def chunk_bounds(length: int, chunks: int) -> list[Segment]:
    """[start, end) of each of `chunks` near-equal chunks of range(length) (torch.tensor_split sizes)."""
    base, extra = divmod(length, chunks)
    bounds, start = [], 0
    for i in range(chunks):
        end = start + base + (1 if i < extra else 0)
        bounds.append((start, end))
        start = end
    return bounds


def sequence_segments(length: int, world_size: int, rank: int, layout: str) -> list[Segment]:
    """The global positions rank `rank` holds, in the order its shard stores them.

    "contiguous": one run; "zigzag": the pair of chunks r and 2P-1-r.
    """
    if check_layout(layout, "sequence_segments") == "zigzag":
        chunks = chunk_bounds(length, 2 * world_size)
        return [chunks[rank], chunks[2 * world_size - 1 - rank]]
    return [chunk_bounds(length, world_size)[rank]]


def shard_lengths(length: int, world_size: int, layout: str) -> list[int]:
    """How many positions each rank holds under `layout`."""
    return [sum(e - s for s, e in sequence_segments(length, world_size, r, layout)) for r in range(world_size)]


def positions(segments: list[Segment], device=None) -> torch.Tensor:
    """(L,) int64 global positions of a shard made of `segments`."""
    return torch.cat([torch.arange(s, e, device=device) for s, e in segments])


def gathered_positions(length: int, world_size: int, layout: str, device=None) -> torch.Tensor:
    """(N,) the global position at each index of every rank's shard concatenated in rank order."""
    return torch.cat([positions(sequence_segments(length, world_size, r, layout), device)
                      for r in range(world_size)])


def min_length(world_size: int, layout: str) -> int:
    """The shortest sequence every rank gets a position of: P, or 2P for the zig-zag layout."""
    return 2 * world_size if check_layout(layout, "min_length") == "zigzag" else world_size


def shard_sequence(x: torch.Tensor, *, layout: str, group=None, dim: int = 2) -> torch.Tensor:
    """This rank's shard of the full tensor `x` along `dim` (default 2: (B, H, N, D) -> (B, H, L_r, D)).

    layout: "contiguous" (rank r holds chunk r of P) or "zigzag" (chunks r and 2P-1-r of 2P; balances
    causal work). Pass the same layout to ring_attention / ulysses_attention. No communication.
    """
    check_layout(layout, "shard_sequence")
    if not isinstance(x, torch.Tensor):
        raise AttentionError(f"shard_sequence expects a torch.Tensor; got {type(x).__name__}.")
    dim = _check_dim(x, dim)
    P, rank = group_size(group), group_rank(group)
    N = x.shape[dim]
    if N < min_length(P, layout):
        raise AttentionError(f"shard_sequence: a sequence of {N} positions cannot be cut into the {layout} layout "
                             f"over {P} ranks; expected N >= {min_length(P, layout)}.")
    parts = [x.narrow(dim, s, e - s) for s, e in sequence_segments(N, P, rank, layout)]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim)


def unshard_sequence(x: torch.Tensor, *, layout: str, group=None, dim: int = 2) -> torch.Tensor:
    """The full tensor from every rank's shard along `dim`, in position order (an all_gather).

    The inverse of shard_sequence with the same `layout`. Every rank receives the whole tensor.
    Not differentiable: use it to inspect or hand results on, not inside a training step.
    """
    pg = resolve_group(group)

    def describe() -> list[int]:
        check_layout(layout, "unshard_sequence")
        if not isinstance(x, torch.Tensor):
            raise AttentionError(f"unshard_sequence expects a torch.Tensor; got {type(x).__name__}.")
        d = _check_dim(x, dim)
        if x.dim() > MAX_DIMS:
            raise AttentionError(f"unshard_sequence takes tensors of up to {MAX_DIMS} dims; got {x.dim()}.")
        others = [n for i, n in enumerate(x.shape) if i != d]
        return [x.shape[d], LAYOUTS.index(layout), d, dtype_code(x.dtype), *others, *[-1] * (MAX_DIMS - len(others))]

    rows = agree(pg, describe, 4 + MAX_DIMS, "unshard_sequence")
    if len({row[1] for row in rows}) > 1:
        raise AttentionError(f"unshard_sequence: ranks disagree on layout: {[LAYOUTS[row[1]] for row in rows]} in "
                             "rank order; every rank must pass the same layout.")
    if len({tuple(row[2:]) for row in rows}) > 1:
        raise AttentionError("unshard_sequence: the shards differ in dim, dtype or a size outside `dim` "
                             f"across ranks: {[row[2:] for row in rows]} (dim, dtype, other sizes) in rank order.")
    lengths = [row[0] for row in rows]
    N, P = sum(lengths), len(lengths)
    if N < min_length(P, layout):
        raise AttentionError(f"unshard_sequence: N={N} positions in all cannot be the {layout} layout over {P} "
                             f"ranks (it needs N >= {min_length(P, layout)}); pass the layout used to shard.")
    expected = shard_lengths(N, P, layout)
    if lengths != expected:
        raise AttentionError(f"unshard_sequence: shard lengths {lengths} are not the {layout} layout of N={N} over "
                             f"{P} ranks, which is {expected}; pass the layout used to shard.")
    d = rows[0][2]
    gathered = torch.cat(all_gather_uneven(x.detach(), d, pg, lengths), d)
    order = torch.argsort(gathered_positions(N, P, layout, x.device))  # natural position -> gathered index
    return gathered.index_select(d, order)


def _check_dim(x: torch.Tensor, dim: int) -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or not -x.dim() <= dim < x.dim():
        raise AttentionError(f"dim must be an int in [-{x.dim()}, {x.dim()}) for a tensor of {x.dim()} dims; "
                             f"got {dim!r}.")
    return dim % x.dim()
