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

from multihead.check.calling import CallSpec, LearnerError, invoke


def _unchanged(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    return bool(torch.allclose(a, b, atol=tol, rtol=tol, equal_nan=True))


def _raw_call(module, spec: CallSpec, tensors):
    """Call with the tensors as given (no layout conversion), keys = values = queries for self mode."""
    raw = CallSpec(**{**spec.__dict__, "layout": "batch"})
    return invoke(module, raw, *tensors)


def deterministic(module: nn.Module, spec: CallSpec, inputs, tol: float) -> bool:
    """Do two identical calls (eval mode) give the same output?"""
    return _unchanged(invoke(module, spec, *inputs), invoke(module, spec, *inputs), tol)


def detect_layout(module: nn.Module, spec: CallSpec, x: torch.Tensor, tol: float) -> str | None:
    """"batch" or "seq" for a (B, L, E)-shaped probe x with B != L; None when neither fits."""
    tensors = [x] if spec.inputs == "x" else [x, x + 0.5, x - 0.25][: {"q_kv": 2, "qkv": 3}[spec.inputs]]
    base = _raw_call(module, spec, tensors)
    if base.dim() != 3 or base.shape[:2] != x.shape[:2]:
        return None
    for dim, layout in ((0, "batch"), (1, "seq")):
        bump = torch.zeros_like(x)
        bump.select(dim, 0).fill_(1.0)
        moved = _raw_call(module, spec, [t + bump for t in tensors])
        if _unchanged(base.narrow(dim, 1, x.shape[dim] - 1), moved.narrow(dim, 1, x.shape[dim] - 1), tol):
            return layout
    return None


def detect_causal(module: nn.Module, spec: CallSpec, x: torch.Tensor, tol: float) -> bool:
    """True when some token's output ignores the last token (x batch first, L >= 3)."""
    tensors = [x, x, x][: {"x": 1, "q_kv": 2, "qkv": 3}[spec.inputs]]
    base = invoke(module, spec, *tensors)
    bump = torch.zeros_like(x)
    bump[:, -1] = 1.0
    moved = invoke(module, spec, *[t + bump for t in tensors])
    return any(_unchanged(base[:, i], moved[:, i], tol) for i in range(x.shape[1] - 1))


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


def accepts_cross_lengths(module: nn.Module, spec: CallSpec, xq: torch.Tensor, xk: torch.Tensor) -> bool:
    """Does the module run with Lq != Lk (only meaningful with separate key/value inputs)?"""
    if spec.inputs == "x":
        return False
    try:
        out = invoke(module, spec, xq, xk, xk)
    except LearnerError:
        return False
    return out.shape[:2] == xq.shape[:2]
