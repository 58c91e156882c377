"""Compare the learner's module with ``multihead.MultiHeadAttention`` carrying the same weights.

The reference module is called through ``torch.func.functional_call`` with the learner's own parameter
tensors (sliced and stacked by the role assignment), so one backward pass gives gradients on the
learner's parameters from both sides: forward outputs, input gradients and parameter gradients are
compared case by case.
"""

from __future__ import annotations

import torch
from torch.func import functional_call

from multihead.checker.loading.calling import INPUT_COUNT, CallSpec, attention_inputs, invoke
from multihead.checker.behaviour.options import Options
from multihead.checker.roles.assign import RoleAssignment, Weights
from multihead.convert import linears_to_module
from multihead.masks import Mask
from multihead.layers.multi_head import MultiHeadAttention


def agree(a: torch.Tensor, b: torch.Tensor, tol: float) -> bool:
    """Equal within ``tol`` (absolute and relative), NaN matching NaN."""
    return bool(torch.allclose(a, b, atol=tol, rtol=tol, equal_nan=True))


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want|; NaN where both are NaN counts as equal, elsewhere as infinite."""
    if got.shape != want.shape:
        return float("inf")
    got, want = got.detach().double(), want.detach().double()
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    if not torch.equal(nan_got, nan_want):
        return float("inf")
    got, want = got.masked_fill(nan_got, 0.0), want.masked_fill(nan_want, 0.0)
    scale = float(want.abs().max()) if want.numel() else 0.0
    return float((got - want).abs().max()) / max(scale, 1e-6) if got.numel() else 0.0


def reference_parameters(weights: Weights, options: Options | None = None) -> tuple[MultiHeadAttention, dict]:
    """A MultiHeadAttention shaped like ``weights`` (with the ``options`` found) and the parameter dict to
    call it with: the learner's own tensors, so that gradients reach them (no output projection: its
    identity stays)."""
    pairs = {"q_proj": weights.q, "k_proj": weights.k, "v_proj": weights.v, "out_proj": weights.o}
    reference = linears_to_module(*pairs.values(), num_heads=weights.num_heads,
                                  **(options.reference_kwargs() if options else {}))
    if weights.rope is not None:  # q and k turned by mh.RoPE in the layout the learner's module uses
        reference.rope = weights.rope.module(weights.head_dim)
    params = {}
    for name, pair in pairs.items():
        if pair is not None:
            params[f"{name}.weight"], bias = pair
            if bias is not None:
                params[f"{name}.bias"] = bias
    if options is not None:
        options.reference_layers(reference, weights.head_dim, params)
    return reference.eval(), params


def reference_output(weights: Weights, spec: CallSpec, xq, xk, xv, keep) -> torch.Tensor:
    """multihead's output for batch-first inputs and a keep pattern (B, Lq, Lk) or None."""
    reference, params = reference_parameters(weights, spec.options)
    mask = None if keep is None else Mask.keep(keep[:, None])  # (B, 1, Lq, Lk)
    args = attention_inputs(spec, xq, xk, xv)
    return functional_call(reference, params, args, {"mask": mask, "causal": spec.causal_with(keep)})


def compare_with_reference(module, spec: CallSpec, roles: RoleAssignment, cases):
    """(max forward error, max gradient error) over the cases, both relative to the reference's
    largest magnitude (gradients: over the inputs and all the learner's parameters together)."""
    forward_error = grad_error = 0.0
    for index, (xq, xk, xv, keep) in enumerate(cases):
        inputs = [t.detach().clone().requires_grad_(True) for t in (xq, xk, xv)[:INPUT_COUNT[spec.inputs]]]
        full = inputs + [None] * (3 - len(inputs))
        got = invoke(module, spec, *full, keep=keep)
        want = reference_output(roles.weights(module), spec, *full, keep=keep)
        forward_error = max(forward_error, relative_error(got, want))
        grad_error = max(grad_error, gradient_error(got, want, inputs + learned_parameters(module), index))
    return forward_error, grad_error


def learned_parameters(module) -> list[torch.Tensor]:
    """The module's parameters that take gradients (materialised ones only)."""
    return [p for p in module.parameters()
            if p.requires_grad and not isinstance(p, torch.nn.UninitializedParameter)]


def gradient_error(got: torch.Tensor, want: torch.Tensor, wrt: list[torch.Tensor], seed: int) -> float:
    """The relative error of got's gradients against want's, with respect to ``wrt`` together, for one random
    cotangent; infinite when the learner's forward cut the graph (no_grad, detach...)."""
    if not got.requires_grad:
        return float("inf")
    cotangent = torch.randn(want.shape, dtype=want.dtype, generator=torch.Generator().manual_seed(seed))
    # (out * cotangent).sum() backpropagates the same vector-Jacobian product as grad_outputs=cotangent,
    # without torch's shape check for grad_outputs, which imports sympy (a third of a second per check)
    got_grads = torch.autograd.grad((got * cotangent).sum(), wrt, allow_unused=True)
    want_grads = torch.autograd.grad((want * cotangent).sum(), wrt, allow_unused=True)
    # one scale for all gradients: a gradient that is zero in theory (a key bias) is not
    # measured against its own rounding noise
    zeros = [torch.zeros_like(t) for t in wrt]
    got_flat = torch.cat([(g if g is not None else z).flatten() for g, z in zip(got_grads, zeros)])
    want_flat = torch.cat([(w if w is not None else z).flatten() for w, z in zip(want_grads, zeros)])
    return relative_error(got_flat, want_flat)
