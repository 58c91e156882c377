"""SequencePlan: what every rank agreed on for one sequence-parallel call, checked the same everywhere.

Shapes: q (B, H, Lq_r, D), k (B, Hkv, Lk_r, D), v (B, Hkv, Lk_r, Dv) on rank r: the shards of the
global (B, H, Nq, D) and (B, Hkv, Nk, D) under the layout the caller names ("contiguous" or
"zigzag", see layout.py). The plan knows every rank's global positions, so each rank can
evaluate the mask on any (query, key) tile and knows the size of every block it will receive.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from multihead.attention import make_problem
from multihead.errors import AttentionError, check_flag
from multihead.masks import Index, Mask
from multihead.parallel import layout
from multihead.parallel.comm import resolve_group
from multihead.parallel.sequence_masks import check_sequence_mask, fingerprint, is_causal_call, split_static_causal
from multihead.parallel.validation import agree, dtype_code, dtype_name, require_same

# the row each rank contributes: column names, in order
COLUMNS = ("B", "H", "Hkv", "Lq", "Lk", "D", "Dv", "dtype", "causal", "layout", "mask", "device type")
DEVICE_TYPES = ("cpu", "cuda")


@dataclass(frozen=True, eq=False)
class SequencePlan:
    """One agreed call: sizes, every rank's shard lengths, the split, and the mask left to evaluate.

    zigzag: the shards follow the zig-zag layout (else contiguous). static_causal: top-left causal,
    handled from positions alone. mask: the rest of the mask (global positions), or None.
    """

    group: dist.ProcessGroup
    rank: int
    world_size: int
    B: int
    H: int
    Hkv: int
    D: int
    Dv: int
    q_lengths: tuple[int, ...]
    k_lengths: tuple[int, ...]
    zigzag: bool
    static_causal: bool
    mask: Mask | None
    scale: float

    @property
    def Nq(self) -> int:
        return sum(self.q_lengths)

    @property
    def Nk(self) -> int:
        return sum(self.k_lengths)

    @property
    def layout(self) -> str:
        return "zigzag" if self.zigzag else "contiguous"

    def q_segments(self, rank: int) -> list[layout.Segment]:
        return layout.sequence_segments(self.Nq, self.world_size, rank, self.layout)

    def k_segments(self, rank: int) -> list[layout.Segment]:
        return layout.sequence_segments(self.Nk, self.world_size, rank, self.layout)

    def base_index(self, device) -> Index | None:
        """The mask's grid over the whole sequence with its extents (O(N)), or None without a mask."""
        return None if self.mask is None else self.mask.normal_form().index(self.B, self.H, self.Nq, self.Nk, device)


def plan_sequence_call(q, k, v, mask, causal, shard_layout, group, who: str, *,
                       heads_per_rank: bool = False) -> SequencePlan:
    """Check one call on every rank together (see validation.py) and return the agreed plan.

    heads_per_rank: the call splits heads over ranks (Ulysses): H must divide by P, and Hkv by P or P by Hkv.
    """
    pg = resolve_group(group)

    def describe() -> list[int]:
        make_problem(q, k, v, None, False, None, 0.0)  # the core's own checks of q, k, v
        check_flag(causal, "causal")
        layout.check_layout(shard_layout, who)
        check_sequence_mask(mask, who)
        _check_device_fits_backend(q.device, pg, who)
        B, H, Lq, D = q.shape
        _, Hkv, Lk, Dv = v.shape
        kind = DEVICE_TYPES.index(q.device.type) if q.device.type in DEVICE_TYPES else len(DEVICE_TYPES)
        return [B, H, Hkv, Lq, Lk, D, Dv, dtype_code(q.dtype), is_causal_call(mask, causal),
                layout.LAYOUTS.index(shard_layout), fingerprint(mask), kind]

    rows = agree(pg, describe, len(COLUMNS), who)
    col = {name: i for i, name in enumerate(COLUMNS)}
    require_same(rows, {n: col[n] for n in ("B", "H", "Hkv", "D", "Dv", "dtype", "causal", "layout", "device type")},
                 who, names={"dtype": dtype_name, "causal": bool, "layout": layout.LAYOUTS.__getitem__})
    require_same(rows, {"mask (kinds, shapes and values)": col["mask"]}, who)
    P, B, H, Hkv, D, Dv = len(rows), *(rows[0][col[n]] for n in ("B", "H", "Hkv", "D", "Dv"))
    zigzag = layout.LAYOUTS[rows[0][col["layout"]]] == "zigzag"
    q_lengths = tuple(row[col["Lq"]] for row in rows)
    k_lengths = tuple(row[col["Lk"]] for row in rows)
    for name, lengths in (("q", q_lengths), ("k and v", k_lengths)):
        _check_split(lengths, zigzag, name, who)
    if heads_per_rank and (H % P or (Hkv % P and P % Hkv)):
        raise AttentionError(f"{who} gives each of the {P} ranks H/P query heads and their whole key/value heads; "
                             f"H={H} must divide by {P}, and Hkv={Hkv} must divide by {P} or {P} by Hkv. "
                             "ring_attention has no such limit.")
    static_causal, rest = split_static_causal(mask, causal)
    if mask is not None:  # global shapes, values summed up in the fingerprint: the same verdict everywhere
        try:
            mask.check(B, H, sum(q_lengths), sum(k_lengths), q.device)
        except AttentionError as e:
            raise AttentionError(f"{who}: masks are given in global positions, the same on every rank (key padding "
                                 f"(B, N) for the whole sequence, lengths counting global positions): {e}") from None
    scale = 1.0 / math.sqrt(D) if D else 1.0
    return SequencePlan(pg, dist.get_rank(pg), P, B, H, Hkv, D, Dv, q_lengths, k_lengths, zigzag, static_causal,
                        rest, scale)


def _check_split(lengths: tuple[int, ...], zigzag: bool, name: str, who: str) -> None:
    """AttentionError unless `lengths` (every rank's) are the named layout's; lengths that two layouts share
    (N even over P = 2, for instance) cannot tell a wrong layout, so the caller must name the one used."""
    N, P = sum(lengths), len(lengths)
    split = "zigzag" if zigzag else "contiguous"
    if N < layout.min_length(P, split):
        raise AttentionError(f"{who}: {name} has N={N} positions in all, too few for layout={split!r} over {P} "
                             f"ranks; expected N >= {layout.min_length(P, split)}.")
    expected = list(layout.shard_lengths(N, P, split))
    if list(lengths) != expected:
        raise AttentionError(
            f"{who}: {name} shard lengths are {list(lengths)} in rank order, but layout={split!r} over {P} ranks "
            f"gives {expected} for N={N}. Cut the full sequence with multihead.parallel.shard_sequence(x, "
            f"layout={split!r}), or pass the layout the shards were cut with.")


def _check_device_fits_backend(device: torch.device, group, who: str) -> None:
    backend = str(dist.get_backend(group))
    if device.type == "cpu" and "gloo" not in backend and "mpi" not in backend:
        raise AttentionError(f"{who}: q, k, v are on the CPU but the group's backend is {backend!r}, which moves "
                             "GPU tensors; use a gloo group for CPU tensors.")
    if device.type == "cuda" and backend == "gloo":
        raise AttentionError(f"{who}: q, k, v are on {device} but the group's backend is gloo; "
                             "use NCCL for GPU tensors.")
