"""The functional core: one signature, several backends, every input checked.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0, GQA), Lq queries,
Lk keys, D head dim of q and k, Dv head dim of v.

    out = attention(q, k, v, mask, causal=..., scale=..., softcap=..., sinks=..., dropout=..., backend=...)
          q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv)  ->  out (B, H, Lq, Dv)
    out, lse = attention(..., return_lse=True)                    lse (B, H, Lq) float32
    out = attention(q, k, v, layout="bshd")   q (B, Lq, H, D), k, v (B, Lk, Hkv, D)  ->  out (B, Lq, H, Dv)

Empty inputs: Lq = 0 gives an empty (B, H, 0, Dv) result; Lk = 0 means no query has a key to
attend to, so every row is fully masked and the output is zeros.

The checks read shapes, dtypes and devices only: nothing here waits for a value on the device, so
the call compiles with torch.compile(fullgraph=True) whatever the mask. A call is checked and planned
once per value (multihead.dispatch), then remembered.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from multihead import capture
from multihead.backends.dispatch import plan_call
from multihead.backends.problem import heads_first, make_problem

if TYPE_CHECKING:
    from multihead.backends.kv_forms import Paged, Quantized
    from multihead.masks import Mask

__all__ = ["attention", "make_problem"]


def attention(q: torch.Tensor, k: torch.Tensor | Quantized | Paged, v: torch.Tensor | Quantized | Paged,
              mask: Mask | None = None, *, causal: bool = False,
              scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
              dropout: float = 0.0, backend: str = "auto", return_lse: bool = False,
              layout: str = "bhsd") -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention over heads: softmax(cap(q k^T * scale) + mask) v.

    mask: a `Mask` (True in Mask.keep = may attend; see the Mask constructors for each convention),
    broadcastable to (B, H, Lq, Lk). causal=True adds `Mask.causal()` (top-left aligned).
    scale defaults to 1/sqrt(D). softcap: scores -> softcap * tanh(scores / softcap) (Gemma 2).
    sinks: (H,) logits added to each row's softmax denominator, carrying no value (gpt-oss).
    dropout is applied to the attention weights (pass 0 in eval).
    backend: "auto" (the fastest that is exact for this call), or a name from `mh.dispatch`.
    return_lse=True: also return lse (B, H, Lq) float32, the natural log of each row's softmax denominator
    over the scaled, capped, biased scores, sinks included; -inf for a row that keeps no key. Partial results
    over disjoint keys combine exactly with `mh.merge_states`.
    layout: "bhsd" (B, H, L, D), or "bshd" (B, L, H, D) as flash-attn takes them; out comes back in the same
    layout (lse is (B, H, Lq) in both).
    k and v may also be a KV cache's quantized form (codes and scales, as a cache hands them).
    Query rows that keep no key return exactly 0, with zero gradient. Keys that no query may see
    (padding, lengths) are inert: NaN or inf stored there never reaches the output.
    """
    if layout != "bhsd":
        q, k, v = heads_first(q, k, v, layout)
    problem, chosen, plan = plan_call(q, k, v, mask, causal, scale, softcap, sinks, dropout, backend, return_lse)
    if capture.ACTIVE:
        result = capture.recorded(problem, lambda: chosen.run(problem, plan), chosen, plan, backend)
    else:
        result = chosen.run(problem, plan)
    if layout == "bhsd":
        return result
    return (result[0].transpose(1, 2), result[1]) if return_lse else result.transpose(1, 2)
