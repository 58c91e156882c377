"""The length-aware backend: each sequence attends over its valid slice only.

For a mask with per-sequence lengths (`Mask.lengths(valid_lens, query_lens)`, valid_lens (B,)), batch
element b runs SDPA on q[b, :, :qlen_b] against k, v[b, :, :klen_b], and leaves its padded query
rows at zero, so the work follows sum_b qlen_b * klen_b instead of B * Lq * Lk. Every other part of
the mask (causal, window, ALiBi, dense masks) is evaluated on the slice itself: a bottom-right causal
mask lines up each sequence's last query with its last key, exactly as on the whole grid.

The slices are cut at host-side lengths, so this backend reads the lengths (free on CPU). It is not
used under torch.compile or tracing, and "auto" leaves it alone on accelerators, where reading the
lengths would stall the device.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multihead.backends.problem import Problem
from multihead.backends.sdpa import run_sdpa, score_variants_unsupported
from multihead.masks import Index

# "auto" picks this backend only when the padding is worth B separate kernel calls:
MIN_PADDING = 0.10  # at least this fraction of the (Lq, Lk) grid is padding, and
MIN_SAVED_PER_CALL = 1 << 16  # at least this many score entries saved per extra kernel call


def _valid_lengths(p: Problem) -> list[tuple[int, int]]:
    """[(qlen_b, klen_b)] for each batch element (reads the lengths on the host)."""
    q_lens, k_lens = p.mask.extents()
    klens = k_lens.tolist()
    qlens = q_lens.tolist() if q_lens is not None else [p.dims[2]] * len(klens)
    return list(zip(qlens, klens))


def _padding(p: Problem, lens: list[tuple[int, int]]) -> tuple[float, int]:
    """(fraction of the (B, Lq, Lk) grid that is padding, score entries saved over all heads)."""
    B, H, Lq, Lk = p.dims
    dense = B * Lq * Lk
    valid = sum(ql * kl for ql, kl in lens)
    return (1.0 - valid / dense if dense else 0.0), H * (dense - valid)


def _connected_zeros(q, k, v, Lq: int) -> torch.Tensor:
    """Exact zeros (H, Lq, Dv) that are still connected to q, k and v, so backward() always works
    (with zero gradient), even where the inputs hold NaN."""
    def zero(t):
        return t.masked_fill(torch.ones((), dtype=torch.bool, device=t.device), 0.0)

    H, Dv = q.shape[0], v.shape[-1]
    return (zero(q[:, :1, :1]) + zero(k[:1, :1, :1]) + zero(v[:1, :1, :1])).expand(H, Lq, Dv)


class VarlenBackend:
    name = "varlen"

    def unsupported(self, p: Problem) -> str | None:
        if p.mask is None or p.mask.extents() is None:  # a constant reason: no repr on the hot path
            return "needs per-sequence lengths: exactly one Mask.lengths part with valid_lens of shape (B,)"
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            return "cuts slices at host-side lengths, which torch.compile and tracing cannot follow"
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return f"the fused kernels need non-empty sequences; got Lq={Lq}, Lk={Lk}"
        return score_variants_unsupported(p)

    def declines(self, p: Problem) -> str | None:
        if p.q.device.type != "cpu":
            return "reading the lengths on the host would stall the device; the dense path stays on it"
        B = p.dims[0]
        fraction, saved = _padding(p, _valid_lengths(p))
        if fraction < MIN_PADDING:
            return (f"only {fraction:.0%} of the (Lq, Lk) grid is padding (needs {MIN_PADDING:.0%}); "
                    f"one dense call beats {B} per-sequence calls")
        if saved < MIN_SAVED_PER_CALL * B:
            return (f"skipping the padding saves {saved} score entries, under {MIN_SAVED_PER_CALL} per "
                    f"sequence; {B} separate kernel calls would cost more than they save")
        return None

    def describe(self, p: Problem) -> str:
        fraction, _ = _padding(p, _valid_lengths(p))
        return (f"F.scaled_dot_product_attention per sequence on its valid slice ({p.dims[0]} calls, "
                f"{fraction:.0%} of the (Lq, Lk) grid skipped as padding)"
                + (", enable_gqa=True" if p.gqa else ""))

    def run(self, p: Problem) -> torch.Tensor:
        B, H, Lq, Lk = p.dims
        # unbind / pad / stack rather than writing slices into one zero tensor: their backward
        # allocates each gradient once, where B slice writes would allocate B full-size ones.
        qs, ks, vs = p.q.unbind(0), p.k.unbind(0), p.v.unbind(0)  # B x (H or Hkv, L, D)
        outs = []
        for b, (qlen, klen) in enumerate(_valid_lengths(p)):
            if qlen == 0 or klen == 0:  # no query or no key: the whole sequence's output is 0
                outs.append(_connected_zeros(qs[b], ks[b], vs[b], Lq))
                continue
            q = qs[b][None, :, :qlen]  # (1, H, qlen, D)
            k = ks[b][None, :, :klen]  # (1, Hkv, klen, D)
            v = vs[b][None, :, :klen]  # (1, Hkv, klen, Dv)
            ix = Index.slice(b, qlen, klen, p.q.device)
            o = run_sdpa(q, k, v, p.mask, ix, p.dropout, p.scale, p.gqa)[0]
            outs.append(F.pad(o, (0, 0, 0, Lq - qlen)))  # (H, Lq, Dv), padded query rows are 0
        return torch.stack(outs)  # (B, H, Lq, Dv)
