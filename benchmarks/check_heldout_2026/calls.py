"""The call styles the 2026 held-out zoo adds to those of benchmarks/check_heldout/verify.py: each makes the
calls a learner's caller would make and pairs every output with the float64 reference's.

    run_calls(target, plan, gen) -> [(what, case output, reference output)]

A style not listed here is the older zoo's (self-attention on x, (B, L) keep masks, caches...).
Legend: B batch, L length, LK context length, E embed (32).
"""
from __future__ import annotations

import dataclasses

import torch

from reference import mha
from verify import B, LK, L, first, keep_mask
from verify import run_calls as older_calls


def _context(target, plan, gen, x):
    """Cross-attention over a context whose width is the key projection's input width (not E)."""
    width = plan.weights["k"][0].shape[1]
    context = torch.randn(B, LK, width, generator=gen, dtype=torch.float64)
    return [("x, encoder_hidden_states of width %d" % width,
             first(target(x, encoder_hidden_states=context)), mha(x, context, plan.weights, plan.spec))]


def _seq_first_blocked(target, plan, gen, x):
    """Sequence-first (L, B, E) in and out; no mask (causal inside), then a (B, 1, L, L) bool mask with
    True = blocked holding the causal part and padding."""
    w, spec = plan.weights, plan.spec
    seq_first = x.transpose(0, 1).contiguous()
    keep = torch.ones(L, L, dtype=torch.bool).tril()[None, None] & keep_mask(B, L)[:, None, None, :].bool()
    keep[..., 0] = True  # every query keeps one key, so that no row is empty
    plain = dataclasses.replace(spec, causal=False)
    return [("(L, B, E)", first(target(seq_first)).transpose(0, 1), mha(x, x, w, spec)),
            ("(L, B, E) + (B, 1, L, L) True = blocked", first(target(seq_first, attention_mask=~keep)).transpose(0, 1),
             mha(x, x, w, plain, keep))]


def _keep_bll(target, plan, gen, x):
    """No mask (causal inside), then mask= (B, L, L) bool with True = may attend (causal and padding)."""
    w, spec = plan.weights, plan.spec
    keep = torch.ones(L, L, dtype=torch.bool).tril()[None] & keep_mask(B, L)[:, None, :].bool()
    keep[..., 0] = True
    plain = dataclasses.replace(spec, causal=False)
    return [("x", first(target(x)), mha(x, x, w, spec)),
            ("x, mask (B, L, L) True = attend", first(target(x, mask=keep)), mha(x, x, w, plain, keep[:, None]))]


STYLES = {"ctx": _context, "seq_first_blocked": _seq_first_blocked, "x_keep_bll": _keep_bll}


def run_calls(target, plan, gen: torch.Generator) -> list:
    """(what, case output, reference output) for every call the case's style makes."""
    if plan.call not in STYLES:
        return older_calls(target, plan, gen)
    x = torch.randn(B, L, 32, generator=gen, dtype=torch.float64)
    return STYLES[plan.call](target, plan, gen, x)
