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

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

SOFTMAXES = {torch.softmax, F.softmax, torch.Tensor.softmax, F.log_softmax, torch.log_softmax,
             torch.Tensor.log_softmax}
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
        self.weights_used: set[int] = set()  # id() of every weight handed to F.linear

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        kind = ("softmax" if func in SOFTMAXES else "product" if func in PRODUCTS else "sdpa" if func in SDPA
                else "linear" if func in LINEARS else None)
        if func in SCALINGS and len(args) == 2 and isinstance(args[1], (int, float)):
            factor = 1.0 / args[1] if func in (torch.Tensor.__truediv__, torch.div, torch.Tensor.div) else args[1]
            self.ops.append(Op("scale", (), {"factor": float(factor)}, _detached(out)))
        elif kind is not None:
            if kind == "linear":
                self.weights_used.add(id(kwargs.get("weight", args[1] if len(args) > 1 else None)))
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
    weights_used: set = field(default_factory=set)  # id() of the weights the call handed to F.linear
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
            core = _sdpa_core(op)
            core.prescale = _prescale(ops[:i], core.q, core.k.transpose(-1, -2))
            return _with_merge(core, ops[i + 1:])
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


def _sdpa_core(op: Op) -> Core:
    """An SDPA call's core, its scores and weights written out from its arguments (scale, attn_mask, is_causal,
    enable_gqa) the way the call computes them."""
    q, k, v = op.args[:3]
    names = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
    given = {**dict(zip(names, op.args[3:])), **op.kwargs}
    if given.get("enable_gqa") and k.dim() == 4 and k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    raw = q @ k.transpose(-1, -2)
    scale = given.get("scale")
    scores = raw * (q.shape[-1] ** -0.5 if scale is None else scale)
    Lq, Lk = scores.shape[-2:]
    if given.get("is_causal"):
        scores = scores.masked_fill(torch.ones(Lq, Lk, dtype=torch.bool).tril(Lk - Lq).logical_not(), float("-inf"))
    mask = given.get("attn_mask")
    if isinstance(mask, torch.Tensor):
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    return Core(q, k, v, op.out, scores, raw, torch.softmax(scores, dim=-1), scores.dim() - 1, sdpa=op)


def _prescale(earlier: list[Op], q: torch.Tensor, kt: torch.Tensor) -> float | None:
    """The product of the numbers q and k^T were multiplied by just before the scores product read them (q * D**-0.5,
    or Whisper's q and k each times D**-0.25); None when neither was."""
    factors = []
    for t in (q, kt):
        for op in reversed(earlier):
            if op.kind == "scale" and isinstance(op.out, torch.Tensor) and _holds(op.out, t):
                factors.append(op.kwargs["factor"])
                break
    return math.prod(factors) if factors else None


def _holds(made: torch.Tensor, read: torch.Tensor) -> bool:
    """Is ``read`` ``made``, viewed, transposed or permuted (same elements, in some order)?"""
    if made.numel() != read.numel():
        return False
    return bool(torch.equal(made.reshape(-1), read.reshape(-1)) or torch.equal(
        made.reshape(-1).sort().values, read.reshape(-1).sort().values))


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
    """Attach the input and output of the output projection: the last linear layer after the core whose input
    is as large as the core's output (a gate's linear layer on the input, say, comes before it)."""
    size = core.out.numel()
    linears = [op for op in later if op.kind == "linear" and isinstance(op.args[0], torch.Tensor)
               and isinstance(op.out, torch.Tensor)]
    last = linears[-1] if linears else None
    if last is not None and last.args[0].numel() == size:
        core.merged, core.projected = last.args[0], last.out
    return core
