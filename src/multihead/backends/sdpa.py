"""The fused backend: torch's scaled_dot_product_attention (flash / fused kernels, CPU and GPU).

Its plan is the SDPA arguments of the whole grid (sdpa_args.py), made once per planned call. Sinks run on
the CPU, through the flash kernel's log-sum-exp (sink_rescale.py); elsewhere they are refused (fused.sinks).
"""
from __future__ import annotations

import torch

from multihead.backends.common import flash_lse_unsupported, reference_on_grid, score_variants_unsupported
from multihead.backends.problem import Problem
from multihead.backends.capabilities import Capabilities
from multihead.backends.reasons import Reason, declines
from multihead.backends.sdpa_args import (SdpaArgs, describe_args, kept_keys, run_sdpa, run_sdpa_with_lse, scored_note,
                                          sdpa_args)
from multihead.backends.sdpa_kernel import sdpa_kernel_report

SCORED_REFERENCE = declines("sdpa.scored", "no fused kernel takes a score function (Mask.score_mod); it would run "
                                          "the reference math")
SCORED = "reference math on the whole grid"  # the plan for a mask with a score function (no fused kernel)


class SdpaBackend:
    """Plan: the SdpaArgs of the whole grid (SCORED for a mask with a score function)."""

    name = "sdpa"
    capabilities = Capabilities(empty=False, lse=True)

    def plan(self, p: Problem, auto: bool = True) -> SdpaArgs | str | Reason:
        why = score_variants_unsupported(p)
        if why is not None:
            return why
        if p.form.scored:  # no fused kernel takes a score function: said once, by the math backend, in "auto"
            return SCORED_REFERENCE if auto else SCORED
        if p.lse:
            why = flash_lse_unsupported(p)
            if why is not None:
                return why
        # a softmax without sinks ignores per-row constants; with sinks or the log-sum-exp they count
        own_rows = p.sinks is not None or p.lse
        return sdpa_args(p.form, p.index(rows_may_shift=not own_rows), p.q.dtype, own_rows)

    def describe(self, p: Problem, args: SdpaArgs | str) -> str:
        if args is SCORED:
            return "in place of F.scaled_dot_product_attention" + scored_note(p, "call")
        if p.sinks is not None:
            gqa = ", GQA" if p.gqa else ""
            return f"torch's CPU flash kernel, {describe_args(args)}{gqa}" + scored_note(p, "call")
        k, v = p.k, p.v
        if args.keys is not None:
            k, v = kept_keys(k, args.keys), kept_keys(v, args.keys)
        kernel = sdpa_kernel_report(p.q, k, v, args.attn_mask, args.is_causal, p.dropout, p.scale, p.gqa)
        return (f"F.scaled_dot_product_attention, {describe_args(args)}" + (", enable_gqa=True" if p.gqa else "")
                + f"; torch runs {kernel}")

    def run(self, p: Problem, args: SdpaArgs | str) -> torch.Tensor:
        if args is SCORED:
            return reference_on_grid(p.q, p.k, p.v, p.form, p.index(), p.dropout, p.scale, sinks=p.sinks,
                                     with_lse=p.lse)
        if p.lse:
            return run_sdpa_with_lse(p.q, p.k, p.v, args, p.scale, p.sinks)
        return run_sdpa(p.q, p.k, p.v, args, p.dropout, p.scale, p.gqa, p.sinks)
