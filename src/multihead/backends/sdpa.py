"""The fused backend: torch's scaled_dot_product_attention (flash / fused kernels, CPU and GPU).

The mask keeps its structure on the way in: a pure causal mask becomes `is_causal=True`; anything
else becomes one dense bool keep mask (or one additive float mask when there are offsets).
Rows with no key at all are opened to every key for the kernel and their output set to 0
afterwards, so they come out exactly zero with zero gradient instead of NaN.
"""
from __future__ import annotations

import torch
from torch._C._nn import scaled_dot_product_attention as _sdpa  # the unpatched kernel entry

from multihead.backends.problem import Problem


def _uses_is_causal(p: Problem) -> bool:
    align = p.mask.causal_align if p.mask is not None else None
    B, H, Lq, Lk = p.dims
    return align == "top_left" or (align == "bottom_right" and Lq == Lk)


class SdpaBackend:
    name = "sdpa"

    def unsupported(self, p: Problem) -> str | None:
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return f"the fused kernels need non-empty sequences; got Lq={Lq}, Lk={Lk}"
        return None

    def declines(self, p: Problem) -> str | None:
        return None

    def describe(self, p: Problem) -> str:
        if p.mask is None:
            form = "no mask"
        elif _uses_is_causal(p):
            form = "is_causal=True (the causal structure is kept, no dense mask)"
        else:
            keep, bias = p.dense_mask()
            dense = bias if bias is not None else keep
            kind = "additive float" if bias is not None else "bool keep"
            form = f"dense {kind} mask of shape {tuple(dense.shape)}"
        return f"F.scaled_dot_product_attention, {form}" + (", enable_gqa=True" if p.gqa else "")

    def run(self, p: Problem) -> torch.Tensor:
        if p.mask is None or _uses_is_causal(p):
            return _sdpa(p.q, p.k, p.v, None, p.dropout, p.mask is not None, scale=p.scale, enable_gqa=p.gqa)
        keep, bias = p.dense_mask(dtype=p.q.dtype)
        dead = None
        if keep is not None:
            dead = ~keep.any(dim=-1, keepdim=True)  # (.., Lq, 1): rows that keep no key
            if bool(dead.any()):
                keep = keep | dead  # open them for the kernel; zeroed below
            else:
                dead = None
        if bias is None:
            attn_mask = keep
        elif keep is None:
            attn_mask = bias
        else:
            attn_mask = bias.masked_fill(~keep, float("-inf"))
        out = _sdpa(p.q, p.k, p.v, attn_mask, p.dropout, False, scale=p.scale, enable_gqa=p.gqa)
        return out if dead is None else out.masked_fill(dead, 0.0)
