"""The masks a sharded sequence can take, and how one tile of them is evaluated on global positions.

Masks are written in global coordinates, the same object on every rank: Mask.lengths(valid_lens)
with valid_lens (B,) counting global positions, Mask.key_padding(pad) with pad (B, N) over the
whole sequence. Each rank evaluates them only at the (query, key) positions of the tile in hand,
through an `Index` whose q and k are those global positions; nothing (N, N) is ever built.

What is taken is read from the mask's normal form: position terms (causal in either alignment,
window, chunks), lengths, keeps of whole keys (key padding) and segments. Terms that add to the scores
or vary by head (ALiBi, offsets, score functions) or hold a dense (N, N) tensor are refused: ring and
Ulysses shard by sequence, and a dense mask would put the full N^2 on every rank.
"""
from __future__ import annotations

import hashlib

import torch

from multihead.errors import AttentionError
from multihead.masks import Index, Mask
from multihead.masks.values import values_checkable

TAKEN = "causal, Mask.lengths, Mask.key_padding, Mask.window, Mask.chunks and Mask.segments masks"


def check_sequence_mask(mask, who: str) -> None:
    """AttentionError unless `mask` is None or a Mask made only of terms a sharded sequence can take."""
    if mask is None:
        return
    if not isinstance(mask, Mask):
        raise AttentionError(f"{who}: mask must be a multihead.Mask or None; got {type(mask).__name__}.")
    form = mask.normal_form()
    taken = (*form.positional, *form.unaligned, *form.lengths_parts, *form.key_parts, form.segments_part)
    refused = [p for p in mask.parts if p not in taken]
    if refused:
        raise AttentionError(
            f"{who} takes {TAKEN} (global positions); got {refused[0].describe()}, which it cannot shard by "
            "sequence: a term that adds to the scores, calls a function, or keeps per query or head (a keep/block "
            "mask that varies by query or head would put a dense (N, N) mask, N^2, on every rank). For padding "
            "use Mask.key_padding(pad) with pad (B, N) over the whole sequence.")


def is_causal_call(mask: Mask | None, causal: bool) -> bool:
    """Whether the call is causal (causal=True or a causal term); every rank must agree on it."""
    return causal or (mask is not None and mask.normal_form().causal)


def split_static_causal(mask: Mask | None, causal: bool) -> tuple[bool, Mask | None]:
    """(top-left causal?, the rest of the mask). Top-left causality is known from positions alone, so
    tiles wholly above the diagonal are skipped and tiles below it need no mask."""
    if mask is None:
        return causal, None
    form = mask.normal_form()
    top_left = form.causal_parts if form.align == "top_left" else ()
    rest = tuple(p for p in mask.parts if p not in top_left)
    return causal or bool(top_left), (Mask(rest) if rest else None)


def fingerprint(mask: Mask | None) -> int:
    """A 56-bit summary of the mask's kinds, shapes and (where free to read) values, for comparing
    across ranks: ranks that were handed different masks disagree here instead of computing apart."""
    if mask is None:
        return 0
    summary = [part.describe() for part in mask.parts]
    for t in mask.tensors:
        summary.append(tuple(t.shape))
        if values_checkable(t) and t.numel():
            summary.append((int(t.long().sum()), int(t.long().max())))
    return int.from_bytes(hashlib.sha1(repr(summary).encode()).digest()[:7], "big")


def tile_keep(mask: Mask | None, base: Index | None, q_span: tuple[int, int], k_span: tuple[int, int],
              diagonal: bool, device=None) -> torch.Tensor | None:
    """Bool keep of one tile, broadcastable to (B, H, Tq, Tk), or None when it keeps everything.

    q_span, k_span: the tile's global positions [start, end). base: the mask's whole-sequence grid
    (NormalForm.index), whose `block` reads the mask at those positions. diagonal: the tile straddles the
    top-left causal diagonal, so key j > query i is blocked here (tiles wholly below it need no
    causal mask). device: where the tile's tensors live.
    """
    keep = None
    if mask is not None:
        keep, _ = mask.normal_form().dense(base.block(*q_span, *k_span))  # no taken term adds a bias
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
    form = mask.normal_form()
    parts = [form.key_visible(base.block(0, 1, s, e)) for s, e in segments]
    return None if parts[0] is None else torch.cat(parts, dim=-1)
