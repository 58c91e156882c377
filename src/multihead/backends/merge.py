"""merge_states: attention over several disjoint key sets, put together from each set's (out, lse).

Shape legend: B batch, H query heads, Lq queries, Dv head dim of v, N states.

    out, lse = merge_states([(out_1, lse_1), ..., (out_N, lse_N)])
        out_i (B, H, Lq, Dv), lse_i (B, H, Lq) float32  ->  out (B, H, Lq, Dv) in out_1's dtype, lse (B, H, Lq) float32

Each state is what `mh.attention(q, k_i, v_i, ..., return_lse=True)` returns for one set of keys: its output and
the natural log of each row's softmax denominator. Over the union of the sets, a row's denominator is the sum of
the sets' denominators, and its output the average of the sets' outputs weighted by their denominators:

    lse = log(sum_i exp(lse_i))                 out = sum_i exp(lse_i - lse) * out_i

Computed against the row's largest lse, so nothing overflows. A row that keeps no key in a set has lse_i = -inf
there and contributes nothing (whatever its out_i holds); a row with -inf in every set gets lse = -inf and an
exact zero output. Exact up to float32 rounding, differentiable, and free of host syncs (it compiles).
Ring attention, split-K decoding and cascade decoding (a shared prefix, then each sequence's own suffix) are
all this one merge.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from multihead.errors import AttentionError, shape_str


def _check(states) -> None:
    if isinstance(states, tuple) and len(states) == 2 and isinstance(states[0], torch.Tensor):
        raise AttentionError("merge_states takes a sequence of (out, lse) pairs, got one pair: "
                             "write merge_states([(out_a, lse_a), (out_b, lse_b)])")
    if not isinstance(states, Sequence) or len(states) == 0:
        raise AttentionError(f"merge_states takes a non-empty sequence of (out, lse) pairs, got {type(states).__name__}"
                             + (" of length 0" if isinstance(states, Sequence) else ""))
    out0 = None
    for i, pair in enumerate(states):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                and all(isinstance(t, torch.Tensor) for t in pair)):
            raise AttentionError(f"merge_states: state {i} should be a pair (out, lse) of tensors, got {pair!r:.80}")
        out, lse = pair
        if out.dim() != 4 or lse.shape != out.shape[:3]:
            raise AttentionError(f"merge_states: state {i} has out {shape_str(out.shape)} and lse {shape_str(lse.shape)}; "
                                 "expected out (B, H, Lq, Dv) and lse (B, H, Lq)")
        if not lse.is_floating_point() or not out.is_floating_point():
            raise AttentionError(f"merge_states: state {i} has out {out.dtype} and lse {lse.dtype}; expected floats")
        if out0 is None:
            out0 = out
        elif out.shape != out0.shape or out.device != out0.device:
            raise AttentionError(f"merge_states: state {i} has out {shape_str(out.shape)} on {out.device}, "
                                 f"state 0 has {shape_str(out0.shape)} on {out0.device}; all states must match")


def merge_states(states: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of attention over the union of disjoint key sets, from each set's (out_i, lse_i).

    out_i (B, H, Lq, Dv), lse_i (B, H, Lq)  ->  out (B, H, Lq, Dv) in out_1's dtype, lse (B, H, Lq) float32
    (float64 where the lse_i are).
    """
    _check(states)
    wide = torch.promote_types(states[0][1].dtype, torch.float32)          # float32, or float64 if given
    lses = torch.stack([lse.to(wide) for _, lse in states])                # (N, B, H, Lq)
    top = lses.amax(dim=0)                                                  # (B, H, Lq)
    ref = torch.where(torch.isfinite(top), top, torch.zeros_like(top))      # -inf rows: any finite reference
    weights = torch.exp(lses - ref)                                         # (N, B, H, Lq), 0 where lse_i = -inf
    total = weights.sum(dim=0)                                              # (B, H, Lq)
    lse = ref + torch.log(total)                                            # -inf where no set keeps a key
    share = weights / torch.where(total > 0, total, torch.ones_like(total))  # (N, B, H, Lq), rows sum to 1 or 0
    out = None
    for (out_i, _), w in zip(states, share):
        term = torch.where(w.unsqueeze(-1) > 0, out_i.to(wide) * w.unsqueeze(-1), 0.0)  # out_i unread where w = 0
        out = term if out is None else out + term
    return out.to(states[0][0].dtype), lse
