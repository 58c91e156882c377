"""Record the attention core inside the learner's own forward: scores from q·k, a softmax over keys, weights
times v (or one ``F.scaled_dot_product_attention`` call), and the tensor its output projection reads.

``CoreTrace`` is a ``TorchFunctionMode``: it sees every softmax, product and SDPA call whatever code makes it
(``q @ k.transpose(-1, -2)``, ``torch.einsum``, ``torch.bmm``, ``F.softmax``, ``x.softmax(-1)``), and every
``F.linear`` (nn.Linear included) with its input. ``find_core`` then picks the first softmax whose output is
multiplied by a tensor (the values), the product that made its input's shape (the scores), and the linear
layer whose input holds the core's output values (the output projection).

Shapes: q (..., Lq, D), k^T (..., D, Lk) as the scores product reads them, scores and weights (..., Lq, Lk),
v (..., Lk, Dv), per-head output (..., Lq, Dv), merged (B, Lq, H*Dv) or the module's own layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SOFTMAXES = {torch.softmax, F.softmax, torch.Tensor.softmax, torch.nn.functional.log_softmax}
PRODUCTS = {torch.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.matmul, torch.Tensor.bmm, torch.einsum}
SDPA = {F.scaled_dot_product_attention}
LINEARS = {F.linear}
SCALINGS = {torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.mul, torch.Tensor.mul, torch.Tensor.__truediv__,
            torch.div, torch.Tensor.div}  # recorded when one operand is a plain number: q * scale, q / sqrt(D)


@dataclass
class Op:
    """One recorded call: its kind ("softmax", "product", "sdpa", "linear"), tensor arguments, options, output."""

    kind: str
    args: tuple
    kwargs: dict
    out: object


class CoreTrace(TorchFunctionMode):
    """Record softmaxes, products, SDPA calls and linear layers, in call order (detached copies)."""

    def __init__(self):
        super().__init__()
        self.ops: list[Op] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = ("softmax" if func in SOFTMAXES else "product" if func in PRODUCTS else "sdpa" if func in SDPA
                else "linear" if func in LINEARS else None)
        if func in SCALINGS and len(args) == 2 and isinstance(args[1], (int, float)):
            factor = 1.0 / args[1] if func in (torch.Tensor.__truediv__, torch.div, torch.Tensor.div) else args[1]
            self.ops.append(Op("scale", (), {"factor": float(factor)}, _detached(out)))
        elif kind is not None:
            self.ops.append(Op(kind, tuple(_detached(a) for a in args),
                               {k: _detached(v) for k, v in kwargs.items()}, _detached(out)))
        return out


def _detached(value):
    if isinstance(value, torch.Tensor):  # real floats in float64: stages compare tensors of mixed dtypes
        return value.detach().double() if value.is_floating_point() else value.detach().clone()
    if isinstance(value, (tuple, list)):
        return type(value)(_detached(v) for v in value)
    return value


@dataclass
class Core:
    """The attention core as the learner's forward computed it. ``scores``: the softmax's input (after any
    scale and mask); ``raw``: the q·k product (None for SDPA); ``weights``: the softmax's output and ``dim`` its
    axis; ``out``: weights times values; ``merged``: what the output projection read (None: none found)."""

    q: torch.Tensor
    k: torch.Tensor  # (..., Lk, D): the keys, whichever way the product read them
    v: torch.Tensor
    out: torch.Tensor
    scores: torch.Tensor | None = None
    raw: torch.Tensor | None = None
    weights: torch.Tensor | None = None
    dim: int = -1
    sdpa: Op | None = None
    merged: torch.Tensor | None = None
    prescale: float | None = None  # the number q (or k) was multiplied by on its way into the scores product
    projected: torch.Tensor | None = None  # what the module's last linear layer gave (its output, batch first)


def _dim_of(op: Op) -> int:
    dim = op.kwargs.get("dim", op.args[1] if len(op.args) > 1 and isinstance(op.args[1], int) else -1)
    return dim if dim >= 0 or not isinstance(op.args[0], torch.Tensor) else op.args[0].dim() + dim


def _operands(op: Op) -> tuple:
    """The two tensors a product multiplies (einsum: the two after its equation)."""
    tensors = [a for a in op.args if isinstance(a, torch.Tensor)]
    if not tensors and op.args and isinstance(op.args[-1], (tuple, list)):
        tensors = [a for a in op.args[-1] if isinstance(a, torch.Tensor)]
    return tuple(tensors[:2])


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-6, equal_nan=True)


def find_core(ops: list[Op]) -> Core | None:
    """The first attention core among the recorded ops, or None (no softmax feeding a product, no SDPA)."""
    for i, op in enumerate(ops):
        if op.kind == "sdpa":
            q, k, v = op.args[:3]
            return _with_merge(Core(q, k, v, op.out, sdpa=op), ops[i + 1:])
        if op.kind != "softmax" or not isinstance(op.args[0], torch.Tensor) or op.args[0].dim() < 2:
            continue
        scores, weights = op.args[0], op.out
        after = next((j for j in range(i + 1, len(ops)) if ops[j].kind == "product"
                      and _reads_weights(_operands(ops[j]), weights)), None)
        before = next((j for j in range(i - 1, -1, -1) if ops[j].kind == "product"
                       and isinstance(ops[j].out, torch.Tensor) and ops[j].out.shape[:-1] == scores.shape[:-1]
                       and ops[j].out.shape[-1] in (scores.shape[-1], scores.shape[-1] - 1)), None)
        if after is None or before is None:
            continue
        q, kt = _operands(ops[before])
        w_used, v = _operands(ops[after])
        if ops[before].args and isinstance(ops[before].args[0], str):  # einsum: read its keys as (..., Lk, D)
            k = kt
        else:
            k = kt.transpose(-1, -2)
        core = Core(q, k, v, ops[after].out, scores, ops[before].out, weights, _dim_of(op))
        core.prescale = _prescale(ops[:before], q, kt)
        return _with_merge(core, ops[after + 1:])
    return None


def _prescale(earlier: list[Op], q: torch.Tensor, kt: torch.Tensor) -> float | None:
    """The factor of the last scaling by a number whose output the scores product read as q or k^T."""
    for op in reversed(earlier):
        if op.kind == "scale" and isinstance(op.out, torch.Tensor) and any(
                op.out.numel() == t.numel() and torch.equal(op.out.reshape(-1), t.reshape(-1))
                or op.out.shape[-2:] == t.shape[-2:][::-1] and torch.equal(op.out.transpose(-1, -2), t)
                for t in (q, kt)):
            return op.kwargs["factor"]
    return None


def _reads_weights(operands: tuple, weights: torch.Tensor) -> bool:
    """Does a product read the softmax's output (all of it, or without a last sink column)?"""
    if len(operands) < 2:
        return False
    first = operands[0]
    if first.shape == weights.shape:
        return _same_values(first, weights)
    if first.shape[:-1] == weights.shape[:-1] and first.shape[-1] == weights.shape[-1] - 1:
        return _same_values(first, weights[..., :-1])
    return False


def _with_merge(core: Core, later: list[Op]) -> Core:
    """Attach the input of the first linear layer after the core that holds the core's output values."""
    size = core.out.numel()
    for op in later:
        if op.kind != "linear" or not isinstance(op.args[0], torch.Tensor):
            continue
        seen = op.args[0]
        if seen.numel() == size:
            core.merged = seen
            break
    linears = [op for op in later if op.kind == "linear" and isinstance(op.out, torch.Tensor)]
    core.projected = linears[-1].out if linears and core.merged is not None else None
    return core
