"""The functional core: one signature, several backends, every input checked.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0, GQA), Lq queries,
Lk keys, D head dim of q and k, Dv head dim of v.

    out = attention(q, k, v, mask, causal=..., scale=..., softcap=..., sinks=..., dropout=..., backend=...)
          q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv)  ->  out (B, H, Lq, Dv)

Empty inputs: Lq = 0 gives an empty (B, H, 0, Dv) result; Lk = 0 means no query has a key to
attend to, so every row is fully masked and the output is zeros.

The checks read shapes, dtypes and devices only: nothing here waits for a value on the device, so
the call compiles with torch.compile(fullgraph=True) whatever the mask.
"""
from __future__ import annotations

import math

import torch

from multihead import capture
from multihead.backends import Problem
from multihead.dispatch import pick
from multihead.errors import AttentionError, check_flag, check_number, shape_str
from multihead.masks import Mask

_CAUSAL = Mask.causal()


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None = None, *, causal: bool = False,
              scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
              dropout: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Scaled dot-product attention over heads: softmax(cap(q k^T * scale) + mask) v.

    mask: a `Mask` (True in Mask.keep = may attend; see the Mask constructors for each convention),
    broadcastable to (B, H, Lq, Lk). causal=True adds `Mask.causal()` (top-left aligned).
    scale defaults to 1/sqrt(D). softcap: scores -> softcap * tanh(scores / softcap) (Gemma 2).
    sinks: (H,) logits added to each row's softmax denominator, carrying no value (gpt-oss).
    dropout is applied to the attention weights (pass 0 in eval).
    backend: "auto" (the fastest that is exact for this call), or a name from `mh.dispatch`.
    Query rows that keep no key return exactly 0, with zero gradient. Keys that no query may see
    (padding, lengths) are inert: NaN or inf stored there never reaches the output.
    """
    problem = make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks)
    if capture.ACTIVE:
        capture.notify(problem)
    return pick(problem, backend).run(problem)


def make_problem(q, k, v, mask, causal, scale, dropout, softcap=None, sinks=None) -> Problem:
    """Check every input and fold `causal` into the mask. Raises AttentionError."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise AttentionError(f"{name} must be a torch.Tensor of shape (B, H, L, D); got {type(t).__name__}.")
        if t.dim() != 4:
            raise AttentionError(f"{name} must have 4 dims (B, H, L, D); got shape {shape_str(t.shape)}.")
    if not (q.dtype == k.dtype == v.dtype):
        raise AttentionError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}.")
    if not q.is_floating_point():
        raise AttentionError(f"q, k, v must be floating point; got {q.dtype}.")
    if not (q.device == k.device == v.device):
        raise AttentionError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}.")
    B, H, Lq, D = q.shape
    Bk, Hkv, Lk, Dk = k.shape
    if k.shape[:3] != v.shape[:3]:
        raise AttentionError(
            f"k and v must agree on (B, Hkv, Lk); got k {shape_str(k.shape)} and v {shape_str(v.shape)}."
        )
    if Bk != B:
        raise AttentionError(f"q has batch {B} but k/v have batch {Bk}.")
    if Dk != D:
        raise AttentionError(f"q and k must share the head dim D; got q D={D}, k D={Dk}.")
    if Hkv == 0 or H % Hkv:
        raise AttentionError(
            f"query heads H={H} must be a multiple of key/value heads Hkv={Hkv} (grouped-query attention)."
        )
    if mask is not None and not isinstance(mask, Mask):
        raise AttentionError(
            f"mask must be a multihead.Mask; got {type(mask).__name__}. Say what your tensor means: "
            "Mask.keep(t) (True = attend), Mask.block(t) (True = blocked), Mask.additive(t) (float "
            "offsets), Mask.key_padding(t) (True = padding) or Mask.lengths(valid_lens)."
        )
    if causal is True or (causal is not False and check_flag(causal, "causal")):
        mask = _CAUSAL if mask is None else mask & _CAUSAL
    if mask is not None:
        mask.check(B, H, Lq, Lk, q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D else 1.0
    elif type(scale) is not float or not 0.0 < scale < math.inf:  # the common float passes without a call
        check_number(scale, "scale", "a positive finite number", lambda x: math.isfinite(x) and x > 0)
    if type(dropout) is not float or not 0.0 <= dropout < 1.0:
        check_number(dropout, "dropout", "a probability in [0, 1)", lambda x: 0.0 <= x < 1.0)
    if softcap is not None:
        check_number(softcap, "softcap", "a positive finite number or None", lambda x: math.isfinite(x) and x > 0)
        softcap = float(softcap)
    if sinks is not None:
        _check_sinks(sinks, H, q)
    return Problem(q, k, v, mask, float(scale), float(dropout), softcap, sinks)


def _check_sinks(sinks, H: int, q: torch.Tensor) -> None:
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise AttentionError(f"sinks must be a float tensor of shape (H={H},); got {sinks!r:.60}.")
    if tuple(sinks.shape) != (H,):
        raise AttentionError(f"sinks must have shape (H={H},); got {shape_str(sinks.shape)}.")
    if sinks.device != q.device:
        raise AttentionError(f"sinks are on {sinks.device} but q is on {q.device}.")
