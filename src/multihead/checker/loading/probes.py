"""The probe inputs: random batch-first tensors, with and without masks, from fixed seeds.

B = 3 and lengths 5 and 7 keep every size apart (B != L, Lq != Lk, L != head_dim 4 by default), so
that a swapped axis shows up as a wrong shape or a wrong number, never as a coincidence. The longest
sequence is 8 tokens, or 6 (load.LONGEST_PROBE) for a module built with a context length: document
001's own example has context_length = 6.
"""

from __future__ import annotations

import torch

from multihead.checker.loading.calling import CallSpec
from multihead.checker.behaviour.mask_convention import random_pattern

PROBE_BATCH = 3


def inputs(dims, B, Lq, Lk, dtype, seed) -> tuple:
    """Random batch-first (xq (B, Lq, Eq), xk (B, Lk, Ek), xv (B, Lk, Ev))."""
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, L, e, generator=gen).to(dtype) for e, L in zip(dims, (Lq, Lk, Lk)))


def plain_cases(dims, dtype, L, Lk) -> list[tuple]:
    """Two probe cases (xq, xk, xv, None) without a mask, of different sizes."""
    return [(*inputs(dims, PROBE_BATCH, L, Lk, dtype, 10), None),
            (*inputs(dims, 2, L + 1, Lk + 1, dtype, 11), None)]


def masked_cases(spec: CallSpec, dims, dtype, L, Lk) -> list[tuple]:
    """Two probe cases (xq, xk, xv, keep (B, Lq, Lk)) in the family the module's mask can carry."""
    gen = torch.Generator().manual_seed(5)
    cases = []
    if spec.encoding is not None:
        for seed, B in ((12, 3), (13, 2)):
            xq, xk, xv = inputs(dims, B, L, Lk, dtype, seed)
            keep = random_pattern(spec.encoding.family, B, L, Lk, gen)
            if spec.causal:
                keep[..., 0] = True  # every query keeps a key it may causally see
            if spec.encoding.family in ("full", "key"):
                keep = distinct_rows(keep)
            cases.append((xq, xk, xv, keep))
    return cases


def distinct_rows(keep: torch.Tensor) -> torch.Tensor:
    """keep (B, Lq, Lk) with no two batch rows alike (a mask sent to the wrong row must show): a row equal
    to an earlier one gets one more kept key (or, when it keeps them all, one fewer), never key 0."""
    keep = keep.clone()
    for b in range(1, keep.shape[0]):
        for _ in range(keep.shape[-1]):
            if not any(torch.equal(keep[a], keep[b]) for a in range(b)):
                break
            free = (~keep[b, 0, 1:]).nonzero()
            column = 1 + int(free[0]) if len(free) else keep.shape[-1] - 1
            keep[b, :, column] = ~keep[b, :, column] if not len(free) else True
    return keep


def randomise_projections(projections) -> None:
    """Fresh random weights (std 1/sqrt(fan-in)) and biases for every projection, on the checker's own copy:
    a zero-initialised output layer or GPT-2's std-0.02 weights would make the variants look alike."""
    gen = torch.Generator().manual_seed(7)
    layers = {id(p.layer): p for p in projections.values()}
    with torch.no_grad():
        for proj in layers.values():
            for param in proj.layer.parameters(recurse=False):
                if isinstance(param, torch.nn.UninitializedParameter):
                    continue
                if param.dim() >= 2:
                    fan_in = param.shape[0] if proj.kind == "conv1d" else param.shape[-1]
                    std = fan_in ** -0.5
                else:
                    std = 0.5
                param.copy_(torch.randn(param.shape, generator=gen) * std)
