"""Layout and causality of the learner's module, found by perturbing inputs and watching outputs.

* batch first or sequence first: change everything at index 0 of one dimension; the dimension whose
  other indices keep their outputs is the batch (B != L, so the two cannot be confused);
* causal: change the last token; if some earlier token's output stays the same, the module cannot
  see the future (also reports the registered triangular buffer, when there is one);
* Lq != Lk: whether the module accepts queries and keys of different lengths.
"""

from __future__ import annotations

import torch
from torch import nn

from multihead.checker.loading.calling import INPUT_COUNT, CallSpec, LearnerError, invoke
from multihead.checker.compare import agree


def _used(spec: CallSpec, inputs) -> list[torch.Tensor]:
    """The input tensors the forward takes: xq alone, (xq, xk) or (xq, xk, xv)."""
    return list(inputs[:INPUT_COUNT[spec.inputs]])


def nudge(t: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """A fixed random tensor shaped like ``t``: a change that a LayerNorm cannot undo (a constant could)."""
    return torch.randn(t.shape, generator=torch.Generator().manual_seed(seed)).to(t.dtype)


def bumped(tensors, index) -> list[torch.Tensor]:
    """Copies with a random change at ``index`` (e.g. ``(0,)`` for row 0, ``(slice(None), -1)`` for the last
    token)."""
    moved = [t.clone() for t in tensors]
    for t in moved:
        t[index] += nudge(t[index])
    return moved


def deterministic(module: nn.Module, spec: CallSpec, inputs, tol: float) -> bool:
    """Do two identical calls (eval mode) give the same output?"""
    return agree(invoke(module, spec, *inputs), invoke(module, spec, *inputs), tol)


def detect_layout(module: nn.Module, spec: CallSpec, inputs, tol: float) -> str | None:
    """"batch" or "seq" for probes (xq, xk, xv) of one shape (B, L, E*) with B != L; None when neither fits.

    The tensors are passed as they are: a sequence-first module reads dimension 0 as positions.
    """
    raw = CallSpec(**{**spec.__dict__, "layout": "batch"})
    tensors = _used(spec, inputs)
    base = invoke(module, raw, *tensors)
    shape = tensors[0].shape
    if base.dim() != 3 or base.shape[:2] != shape[:2]:
        return None
    for dim, layout in ((0, "batch"), (1, "seq")):
        moved = invoke(module, raw, *bumped(tensors, (slice(None),) * dim + (0,)))
        rest = shape[dim] - 1
        if agree(base.narrow(dim, 1, rest), moved.narrow(dim, 1, rest), tol):
            return layout
    return None


def detect_causal(module: nn.Module, spec: CallSpec, inputs, tol: float) -> bool:
    """True when some token's output ignores the last token (inputs batch first, one length L >= 3)."""
    tensors = _used(spec, inputs)
    base = invoke(module, spec, *tensors)
    moved = invoke(module, spec, *bumped(tensors, (slice(None), -1)))
    return any(agree(base[:, i], moved[:, i], tol) for i in range(tensors[0].shape[1] - 1))


def causal_buffer(module: nn.Module) -> str | None:
    """The name of a registered square triangular buffer (a causal mask), or None."""
    for name, buf in module.named_buffers():
        while buf.dim() > 2 and buf.shape[0] == 1:
            buf = buf[0]  # (1, 1, T, T) -> (T, T)
        if buf.dim() == 2 and buf.shape[0] == buf.shape[1] and buf.shape[0] > 1:
            nonzero = buf != 0
            # triangular, give or take one diagonal (an off-by-one causal mask is still a causal buffer)
            if torch.equal(nonzero, nonzero.triu(0)) or torch.equal(nonzero, nonzero.tril(1)):
                return name
    return None


def accepts_cross_lengths(module: nn.Module, spec: CallSpec, inputs) -> bool:
    """Does the module run with Lq != Lk? ``inputs`` = (xq (B, Lq, Eq), xk (B, Lk, Ek), xv (B, Lk, Ev))."""
    if spec.inputs == "x":
        return False
    try:
        out = invoke(module, spec, *inputs)
    except LearnerError:
        return False
    return out.shape[:2] == inputs[0].shape[:2]
