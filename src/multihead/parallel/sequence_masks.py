"""The masks a sharded sequence can take, and how one tile of them is evaluated on global positions.

Masks are written in global coordinates, the same object on every rank: Mask.lengths(valid_lens)
with valid_lens (B,) counting global positions, Mask.key_padding(pad) with pad (B, N) over the
whole sequence. Each rank evaluates them only at the (query, key) positions of the tile in hand,
through an `Index` whose q and k are those global positions; nothing (N, N) is ever built.

Kinds taken: causal (either alignment), lengths, key padding (a keep/block tensor that varies by
key only), window and segments. Kinds that vary by head (ALiBi, per-head masks) or hold a dense
(N, N) tensor are refused: ring and Ulysses shard by sequence, and a dense mask would put the full
N^2 on every rank.
"""
from __future__ import annotations

import hashlib
import torch

from multihead.errors import AttentionError, shape_str
from multihead.masks import Index, Mask
from multihead.masks.causal import CausalPart
from multihead.masks.keep import KeepPart
from multihead.masks.lengths import LengthsPart
from multihead.masks.mask import values_checkable
from multihead.masks.segments import SegmentsPart
from multihead.masks.window import WindowPart

TAKEN = (CausalPart, LengthsPart, KeepPart, WindowPart, SegmentsPart)


def check_sequence_mask(mask, who: str) -> None:
    """AttentionError unless `mask` is None or a Mask made only of kinds a sharded sequence can take."""
    if mask is None:
        return
    if not isinstance(mask, Mask):
        raise AttentionError(f"{who}: mask must be a multihead.Mask or None; got {type(mask).__name__}.")
    for part in mask.parts:
        if not isinstance(part, TAKEN):
            raise AttentionError(
                f"{who} takes causal, Mask.lengths, Mask.key_padding, Mask.window and Mask.segments masks "
                f"(global positions); got {part.describe()}, which it cannot shard by sequence.")
        if isinstance(part, KeepPart) and (part.keep_tensor.dim() >= 2 and part.keep_tensor.shape[-2] != 1
                                           or part.keep_tensor.dim() >= 3 and part.keep_tensor.shape[-3] != 1):
            raise AttentionError(
                f"{who}: a keep/block mask of shape {shape_str(part.keep_tensor.shape)} varies by query or head; "
                "sharded sequences take key masks only: Mask.key_padding(pad) with pad (B, N) over the whole "
                "sequence (a dense (N, N) mask would put N^2 on every rank).")


def is_causal_call(mask: Mask | None, causal: bool) -> bool:
    """Whether the call is causal (causal=True or a causal part); every rank must agree on it."""
    return causal or (mask is not None and any(isinstance(p, CausalPart) for p in mask.parts))


def split_static_causal(mask: Mask | None, causal: bool) -> tuple[bool, Mask | None]:
    """(top-left causal?, the rest of the mask). Top-left causality is known from positions alone, so
    tiles wholly above the diagonal are skipped and tiles below it need no mask."""
    if mask is None:
        return causal, None
    top_left = [p for p in mask.parts if isinstance(p, CausalPart) and p.align == "top_left"]
    rest = tuple(p for p in mask.parts if p not in top_left)
    return causal or bool(top_left), (Mask(rest) if rest else None)


def fingerprint(mask: Mask | None) -> int:
    """A 56-bit summary of the mask's kinds, shapes and (where free to read) values, for comparing
    across ranks: ranks that were handed different masks disagree here instead of computing apart."""
    if mask is None:
        return 0
    summary = []
    for part in mask.parts:
        item = [part.describe()]
        for name in part.tensor_fields:
            t = getattr(part, name)
            if t is not None:
                item.append(tuple(t.shape))
                if values_checkable(t) and t.numel():
                    item.append((int(t.long().sum()), int(t.long().max())))
        summary.append(tuple(item))
    return int.from_bytes(hashlib.sha1(repr(summary).encode()).digest()[:7], "big")


def tile_keep(mask: Mask | None, base: Index | None, q_span: tuple[int, int], k_span: tuple[int, int],
              diagonal: bool, device=None) -> torch.Tensor | None:
    """Bool keep of one tile, broadcastable to (B, H, Tq, Tk), or None when it keeps everything.

    q_span, k_span: the tile's global positions [start, end). base: the mask's whole-sequence grid
    (Mask.index), whose `block` reads the mask at those positions. diagonal: the tile straddles the
    top-left causal diagonal, so key j > query i is blocked here (tiles wholly below it need no
    causal mask). device: where the tile's tensors live.
    """
    keep = None
    if mask is not None:
        keep, _ = mask.dense(base.block(*q_span, *k_span))  # no taken kind adds a bias
    if diagonal:
        qpos = torch.arange(*q_span, device=device).view(1, 1, -1, 1)
        kpos = torch.arange(*k_span, device=device).view(1, 1, 1, -1)
        causal = kpos <= qpos  # (1, 1, Tq, Tk)
        keep = causal if keep is None else keep & causal
    return keep


def key_visible(mask: Mask | None, base: Index | None, segments) -> torch.Tensor | None:
    """(B, 1, 1, Lk) bool of the keys of a shard made of `segments` that some query may see, or None."""
    if mask is None:
        return None
    parts = [mask.key_keep(base.block(0, 1, s, e)) for s, e in segments]
    return None if parts[0] is None else torch.cat(parts, dim=-1)
