"""Attention on one tile of (queries, keys) with its log-sum-exp, the exact merge, and the tile's gradient.

For one query row with scores s_j over the keys of a tile,

    lse = log sum_j exp(s_j)            out = sum_j exp(s_j - lse) v_j

Two tiles over disjoint keys, (out1, lse1) and (out2, lse2), merge into the attention over both:

    lse = log(exp(lse1) + exp(lse2))    out = exp(lse1 - lse) out1 + exp(lse2 - lse) out2

exactly (up to rounding), in any order, so a rank can meet the keys one block at a time. A row that
keeps no key has lse = -inf and out = 0; merges keep it so, and it ends as exact zeros.

Backward, knowing the final (out, lse) of each row, one tile's share of every gradient needs only
that tile: its final weights are p = exp(s - lse), and with delta = rowsum(dout * out)

    dv = p^T dout    dp = dout v^T    ds = p * (dp - delta)    dq = scale ds k    dk = scale ds^T q

Shapes: q (B, H, Tq, D), k (B, Hkv, Tk, D), v (B, Hkv, Tk, Dv), H a multiple of Hkv (each kv head
serves G = H / Hkv consecutive query heads); keep broadcastable to (B, H, Tq, Tk), True = attend.
Everything is computed in at least float32.
"""
from __future__ import annotations

import torch

from multihead.backends.common import masked_softmax, scored
from multihead.backends.merge import merge_states


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype tiles are computed and accumulated in: at least float32."""
    return torch.promote_types(dtype, torch.float32)


def grouped(t: torch.Tensor, Hkv: int) -> torch.Tensor:
    """(B, H, T, X) -> (B, Hkv, G, T, X): query heads gathered under the kv head they share."""
    B, H, T, X = t.shape
    return t.view(B, Hkv, H // Hkv, T, X)


def per_row(t: torch.Tensor, Hkv: int) -> torch.Tensor:
    """(B, H, T) -> (B, Hkv, G, T, 1): one number per query row, ready to broadcast over keys."""
    B, H, T = t.shape
    return t.view(B, Hkv, H // Hkv, T, 1)


def _finite(t: torch.Tensor) -> torch.Tensor:
    """t with -inf (a row that keeps no key) raised to the dtype's lowest finite value, so that
    exp(s - t) is exp(-inf) = 0 in that row instead of NaN."""
    return t.clamp_min(torch.finfo(t.dtype).min)


def _scores(q, k, keep, scale: float) -> torch.Tensor:
    """(B, Hkv, G, Tq, Tk) scaled scores in the compute dtype (the core's score pipeline), blocked entries -inf
    (with keep)."""
    acc = compute_dtype(q.dtype)
    s = scored(grouped(q.to(acc), k.shape[1]) @ k.to(acc).unsqueeze(2).transpose(-1, -2), scale)
    if keep is not None:
        s.masked_fill_(~keep.unsqueeze(1), float("-inf"))  # keep (B|1, 1, Tq|1, Tk) -> 5 dims
    return s


def tile_forward(q, k, v, keep, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Tq, Dv), lse (B, H, Tq)) of attention over this tile's keys alone: the reference masked
    softmax (backends/common.py) with its log-sum-exp."""
    acc = compute_dtype(q.dtype)
    s = _scores(q, k, None, scale)  # (B, Hkv, G, Tq, Tk)
    weights, lse = masked_softmax(s, None if keep is None else keep.unsqueeze(1), with_lse=True)
    out = weights @ v.to(acc).unsqueeze(2)  # (B, Hkv, G, Tq, Dv); a row that keeps no key stays 0
    return out.flatten(1, 2), lse.flatten(1, 2)


def merge(out: torch.Tensor, lse: torch.Tensor, tile_out: torch.Tensor, tile_lse: torch.Tensor) -> None:
    """Fold a tile's (tile_out, tile_lse) into the running (out, lse) in place, by the core's merge_states.

    out (B, H, T, Dv), lse (B, H, T).
    """
    merged, total = merge_states([(out, lse), (tile_out, tile_lse)])
    out.copy_(merged)
    lse.copy_(total)


def tile_backward(q, k, v, keep, scale: float, lse, dout, delta):
    """This tile's shares (dq (B, H, Tq, D), dk (B, Hkv, Tk, D), dv (B, Hkv, Tk, Dv)), in the compute dtype.

    lse, delta (B, H, Tq): each row's final log-sum-exp and rowsum(dout * out); dout (B, H, Tq, Dv).
    """
    Hkv = k.shape[1]
    s = _scores(q, k, keep, scale)  # (B, Hkv, G, Tq, Tk)
    acc = s.dtype
    p = s.sub_(_finite(per_row(lse, Hkv))).exp_()  # the final weights of this tile's keys, in place
    dout_g = grouped(dout.to(acc), Hkv)  # (B, Hkv, G, Tq, Dv)
    dv = (p.transpose(-1, -2) @ dout_g).sum(2)  # (B, Hkv, Tk, Dv): summed over the G query heads
    ds = (dout_g @ v.to(acc).unsqueeze(2).transpose(-1, -2)).sub_(per_row(delta, Hkv)).mul_(p)  # p (dp - delta)
    dq = (ds @ k.to(acc).unsqueeze(2)) * scale  # (B, Hkv, G, Tq, D)
    dk = (ds.transpose(-1, -2) @ grouped(q.to(acc), Hkv)).sum(2) * scale  # (B, Hkv, Tk, D)
    return dq.flatten(1, 2), dk, dv
