"""The length-aware backend: each sequence attends over its valid slice only.

For a `Mask.lengths(valid_lens, query_lens)` mask (optionally `& Mask.causal()`), batch element b
runs SDPA on q[b, :, :qlen_b] against k, v[b, :, :klen_b] and leaves its padded query rows at zero,
so the work follows sum_b qlen_b * klen_b instead of B * Lq * Lk. The slices start at position 0,
so SDPA's top-left `is_causal` is the same causal mask the dense path builds. Sequences with no valid
key or query come out exactly zero with zero gradient, as on every backend.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch._C._nn import scaled_dot_product_attention as _sdpa  # the unpatched kernel entry

from multihead.backends.problem import Problem
from multihead.masks import CausalPart, LengthsPart

# "auto" picks this backend only when the padding is worth B separate kernel calls:
MIN_PADDING = 0.10  # at least this fraction of the (Lq, Lk) grid is padding, and
MIN_SAVED_PER_CALL = 1 << 16  # at least this many score entries saved per extra kernel call


def _structure(p: Problem) -> tuple[LengthsPart, bool] | str:
    """(lengths part, causal) when the mask is lengths [& top-left causal]; else why not."""
    parts = p.mask.parts if p.mask is not None else ()
    lengths = [x for x in parts if isinstance(x, LengthsPart)]
    causal = [x for x in parts if isinstance(x, CausalPart)]
    others = len(parts) - len(lengths) - len(causal)
    if len(lengths) != 1 or others or len(causal) > 1:  # a constant reason: no repr on the hot path
        return "needs exactly one Mask.lengths part, alone or & Mask.causal(), and no other mask"
    if lengths[0].key_lens.dim() != 1:
        return "per-query valid_lens (B, Lq) need a dense mask per sequence; the dense path does that"
    B, H, Lq, Lk = p.dims
    if causal and causal[0].align == "bottom_right" and Lq != Lk:
        return f"bottom-right causal with Lq={Lq} != Lk={Lk} does not survive slicing"
    return lengths[0], bool(causal)


def _valid_lengths(part: LengthsPart, Lq: int) -> list[tuple[int, int]]:
    """[(qlen_b, klen_b)] for each batch element."""
    klens = part.key_lens.tolist()
    qlens = part.query_lens.tolist() if part.query_lens is not None else [Lq] * len(klens)
    return list(zip(qlens, klens))


def _padding(p: Problem, lens: list[tuple[int, int]]) -> tuple[float, int]:
    """(fraction of the (B, Lq, Lk) grid that is padding, score entries saved over all heads)."""
    B, H, Lq, Lk = p.dims
    dense = B * Lq * Lk
    valid = sum(ql * kl for ql, kl in lens)
    return (1.0 - valid / dense if dense else 0.0), H * (dense - valid)


class VarlenBackend:
    name = "varlen"

    def unsupported(self, p: Problem) -> str | None:
        found = _structure(p)
        if isinstance(found, str):
            return found
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return f"the fused kernels need non-empty sequences; got Lq={Lq}, Lk={Lk}"
        return None

    def declines(self, p: Problem) -> str | None:
        part, _ = _structure(p)
        B = p.dims[0]
        fraction, saved = _padding(p, _valid_lengths(part, p.dims[2]))
        if fraction < MIN_PADDING:
            return (f"only {fraction:.0%} of the (Lq, Lk) grid is padding (needs {MIN_PADDING:.0%}); "
                    f"one dense call beats {B} per-sequence calls")
        if saved < MIN_SAVED_PER_CALL * B:
            return (f"skipping the padding saves {saved} score entries, under {MIN_SAVED_PER_CALL} per "
                    f"sequence; {B} separate kernel calls would cost more than they save")
        return None

    def describe(self, p: Problem) -> str:
        part, causal = _structure(p)
        fraction, _ = _padding(p, _valid_lengths(part, p.dims[2]))
        return (f"F.scaled_dot_product_attention per sequence on its valid slice ({p.dims[0]} calls, "
                f"{fraction:.0%} of the (Lq, Lk) grid skipped as padding)"
                + (", is_causal=True" if causal else "") + (", enable_gqa=True" if p.gqa else ""))

    def run(self, p: Problem) -> torch.Tensor:
        part, causal = _structure(p)
        B, H, Lq, Lk = p.dims
        Dv = p.v.shape[-1]
        # unbind / pad / stack rather than writing slices into one zero tensor: their backward
        # allocates each gradient once, where B slice writes would allocate B full-size ones.
        qs, ks, vs = p.q.unbind(0), p.k.unbind(0), p.v.unbind(0)  # B x (H or Hkv, L, D)
        outs = []
        for b, (qlen, klen) in enumerate(_valid_lengths(part, Lq)):
            if qlen == 0 or klen == 0:  # no query or no key: the whole sequence's output is 0
                outs.append(p.q.new_zeros(H, Lq, Dv))
                continue
            q = qs[b][None, :, :qlen]  # (1, H, qlen, D)
            k = ks[b][None, :, :klen]  # (1, Hkv, klen, D)
            v = vs[b][None, :, :klen]  # (1, Hkv, klen, Dv)
            o = _sdpa(q, k, v, None, p.dropout, causal, scale=p.scale, enable_gqa=p.gqa)[0]
            outs.append(F.pad(o, (0, 0, 0, Lq - qlen)))  # (H, Lq, Dv), padded query rows are 0
        return torch.stack(outs)  # (B, H, Lq, Dv)
