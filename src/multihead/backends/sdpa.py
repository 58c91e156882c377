"""The fused backend: torch's scaled_dot_product_attention (flash / fused kernels, CPU and GPU).

Its plan is the SDPA arguments of the whole grid (sdpa_args.py), made once per planned call.
"""
from __future__ import annotations

import torch

from multihead.backends.common import reference_on_grid, score_variants_unsupported
from multihead.backends.problem import Problem
from multihead.backends.reasons import Reason, empty_sequences
from multihead.backends.sdpa_args import SdpaArgs, describe_args, kept_keys, run_sdpa, scored_note, sdpa_args
from multihead.backends.sdpa_kernel import sdpa_kernel_report

EMPTY = empty_sequences("sdpa.empty", "the fused kernels")
SCORED = "reference math on the whole grid"  # the plan for a mask with a score function (no fused kernel)


class SdpaBackend:
    """Plan: the SdpaArgs of the whole grid (SCORED for a mask with a score function)."""

    name = "sdpa"

    def plan(self, p: Problem, auto: bool = True) -> SdpaArgs | str | Reason:
        B, H, Lq, Lk = p.dims
        if Lq == 0 or Lk == 0:
            return EMPTY
        why = score_variants_unsupported(p)
        if why is not None:
            return why
        if p.form.scored:
            return SCORED
        return sdpa_args(p.form, p.index(rows_may_shift=True), p.q.dtype)  # SDPA's softmax has no sinks

    def describe(self, p: Problem, args: SdpaArgs | str) -> str:
        if args is SCORED:
            return "in place of F.scaled_dot_product_attention" + scored_note(p, "call")
        k, v = p.k, p.v
        if args.keys is not None:
            k, v = kept_keys(k, args.keys), kept_keys(v, args.keys)
        kernel = sdpa_kernel_report(p.q, k, v, args.attn_mask, args.is_causal, p.dropout, p.scale, p.gqa)
        return (f"F.scaled_dot_product_attention, {describe_args(args)}" + (", enable_gqa=True" if p.gqa else "")
                + f"; torch runs {kernel}")

    def run(self, p: Problem, args: SdpaArgs | str) -> torch.Tensor:
        if args is SCORED:
            return reference_on_grid(p.q, p.k, p.v, p.form, p.index(), p.dropout, p.scale)
        return run_sdpa(p.q, p.k, p.v, args, p.dropout, p.scale, p.gqa)
