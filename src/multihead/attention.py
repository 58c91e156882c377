"""The functional core: one signature, several backends, every input checked.

Shape legend: B batch, H query heads, Hkv key/value heads (H % Hkv == 0, GQA), Lq queries,
Lk keys, D head dim of q and k, Dv head dim of v.

    out = attention(q, k, v, mask, causal=..., scale=..., softcap=..., sinks=..., dropout=..., backend=...)
          q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv)  ->  out (B, H, Lq, Dv)

Empty inputs: Lq = 0 gives an empty (B, H, 0, Dv) result; Lk = 0 means no query has a key to
attend to, so every row is fully masked and the output is zeros.

The checks read shapes, dtypes and devices only: nothing here waits for a value on the device, so
the call compiles with torch.compile(fullgraph=True) whatever the mask. A call is checked and planned
once per value (multihead.dispatch), then remembered.
"""
from __future__ import annotations

import torch

from multihead import capture
from multihead.backends.problem import make_problem
from multihead.backends.dispatch import plan_call
from multihead.masks import Mask

__all__ = ["attention", "make_problem"]


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
    problem, chosen, plan = plan_call(q, k, v, mask, causal, scale, softcap, sinks, dropout, backend)
    if capture.ACTIVE:
        return capture.recorded(problem, lambda: chosen.run(problem, plan), chosen, plan, backend)
    return chosen.run(problem, plan)
