"""The torch functions ``dataflow.Flow`` tells apart, and how a product with a parameter reads as a linear map.

- MOVES only move elements (views, transposes, splits, slices, repeats): a tensor keeps its origin and its
  shadow moves the same way; KEEPS return the same values (casts, copies, ``contiguous``);
- JOINS (cat, stack) move when every part has one origin, and compute otherwise;
- LINEAR_FUNCS may apply a parameter as a linear map: ``F.linear``, ``torch.addmm`` (GPT-2's Conv1D),
  ``matmul`` / ``@`` / ``mm`` / ``bmm`` in either orientation (x @ W with W (E, O) or (..., E, O); W @ x
  with W (O, E)), and ``einsum`` with one parameter operand and one contracted index
  ("bld,hdk->bhlk": W (H, E, D) gives rows h*D + k);
- CONTRACTIONS of two computed tensors are where attention's roles show (scores, weights times values).

A map is given as ``Product``: the parameter's origin and the index (O, E) of its elements that form the
weight, what it read, its bias (a parameter or None) and the output row of every
output element (broadcastable to the output's shape).
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass

import torch
import torch.nn.functional as F

T = torch.Tensor
MOVES = {
    T.view, T.reshape, torch.reshape, T.transpose, torch.transpose, T.permute, torch.permute, T.__getitem__,
    T.split, torch.split, T.split_with_sizes, T.chunk, torch.chunk, T.unbind, torch.unbind, T.unsqueeze,
    torch.unsqueeze, T.squeeze, torch.squeeze, T.flatten, torch.flatten, T.unflatten, torch.unflatten, T.narrow,
    torch.narrow, T.select, torch.select, T.expand, T.expand_as, T.repeat, T.repeat_interleave,
    torch.repeat_interleave, T.t, torch.t, T.movedim, torch.movedim, T.moveaxis, torch.moveaxis, T.swapaxes,
    torch.swapaxes, T.swapdims, torch.swapdims, T.view_as, T.reshape_as, T.tensor_split, torch.tensor_split,
    T.T.__get__, T.mT.__get__, T.tile, torch.tile, T.broadcast_to, torch.broadcast_to, T.roll, torch.roll,
    T.flip, torch.flip, T.unfold,
}
SHAPE_REFERENCES = {T.expand_as, T.view_as, T.reshape_as}  # their second tensor gives a shape only
KEEPS = {
    T.contiguous, T.clone, torch.clone, T.detach, torch.detach, T.to, T.float, T.double, T.half, T.bfloat16,
    T.type, T.type_as, T.cpu, T.data.__get__, T.requires_grad_,
}
JOINS = {torch.cat, torch.concat, torch.concatenate, torch.stack}
PRODUCTS = {torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm}
LINEAR_FUNCS = PRODUCTS | {F.linear, torch.addmm, T.addmm, torch.einsum}
CONTRACTIONS = PRODUCTS | {torch.einsum, F.scaled_dot_product_attention, torch.baddbmm}


@dataclass
class Product:
    """A product read as y = x W^T + b: ``index`` (O, E) of the parameter's elements, ``read`` what it
    multiplied (its E features: one axis, or several read together), ``bias`` a parameter tensor or None,
    ``rows`` the output row of every output element (broadcastable to the output)."""

    param: object  # the parameter's Origin
    index: torch.Tensor
    read: torch.Tensor
    bias: torch.Tensor | None
    rows: torch.Tensor


def flat_tensors(value) -> list[torch.Tensor]:
    """Every tensor inside nested tuples, lists and dicts, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in flat_tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in flat_tensors(v)]
    return []


def _is_param(origin) -> bool:
    return origin is not None and origin.kind == "param"


def map_of_product(func, args, kwargs, origin_of) -> Product | None:
    """F.linear, addmm, matmul and its kin with one parameter operand, as a Product; None otherwise."""
    if func is F.linear:
        x = args[0] if args else kwargs.get("input")
        weight = args[1] if len(args) > 1 else kwargs.get("weight")
        bias = args[2] if len(args) > 2 else kwargs.get("bias")
        w = origin_of(weight)
        if not _is_param(w) or _is_param(origin_of(x)) or w.shadow.dim() != 2 or not _bias_ok(bias, origin_of):
            return None
        return Product(w, w.shadow, x, bias, torch.arange(w.shadow.shape[0]))
    if func in (torch.addmm, T.addmm):
        if len(args) < 3 or kwargs.get("beta", 1) != 1 or kwargs.get("alpha", 1) != 1:
            return None
        bias, x, weight = args[:3]
        w = origin_of(weight)
        if not _is_param(w) or _is_param(origin_of(x)) or not _bias_ok(bias, origin_of):
            return None
        return Product(w, w.shadow.t(), x, bias, torch.arange(w.shadow.shape[1]))
    a, b = (args[1], args[0]) if func is T.__rmatmul__ else (args[0], args[1])
    a_origin, b_origin = origin_of(a), origin_of(b)
    if _is_param(b_origin) and not _is_param(a_origin) and b_origin.shadow.dim() >= 2:
        shadow = b_origin.shadow  # (..., E, O)
        batch, E, O = shadow.shape[:-2], shadow.shape[-2], shadow.shape[-1]
        index = shadow.movedim(-1, -2).reshape(-1, E)  # (prod(batch) * O, E)
        rows = torch.arange(index.shape[0]).view(*batch, 1, O)
        return Product(b_origin, index, a, None, rows)
    if _is_param(a_origin) and not _is_param(b_origin) and a_origin.shadow.dim() == 2:
        O = a_origin.shadow.shape[0]
        return Product(a_origin, a_origin.shadow, b, None, torch.arange(O)[:, None])
    return None


def _bias_ok(bias, origin_of) -> bool:
    return bias is None or (_is_param(origin_of(bias)) and origin_of(bias).shadow.dim() == 1)


def einsum_map(args, origin_of) -> Product | None:
    """einsum(equation, x, W) (either order): W's indices are contracted with x's (E = their product, in x's
    order) or in the output (O = their product, in the output's order); none of x's in both."""
    if not args or not isinstance(args[0], str) or "->" not in args[0]:
        return None
    operands = list(args[1]) if len(args) == 2 and isinstance(args[1], (list, tuple)) else list(args[1:])
    lhs, out_idx = args[0].replace(" ", "").split("->")
    terms = lhs.split(",")
    if len(operands) != 2 or len(terms) != 2 or not all(isinstance(t, torch.Tensor) for t in operands):
        return None
    terms, out_idx = _without_ellipsis(terms, out_idx, operands)
    origins = [origin_of(t) for t in operands]
    params = [_is_param(o) for o in origins]
    if params.count(True) != 1:
        return None
    w_at = params.index(True)
    w_idx, x_idx, w_origin, x = terms[w_at], terms[1 - w_at], origins[w_at], operands[1 - w_at]
    contracted = [c for c in x_idx if c in w_idx and c not in out_idx]
    w_out = [c for c in out_idx if c in w_idx]  # W's output indices, in the output's order
    if not contracted or len(set(w_idx)) != len(w_idx) or len(contracted) + len(w_out) != len(w_idx) or any(
            c in x_idx for c in w_out):
        return None
    shadow = w_origin.shadow.permute([w_idx.index(c) for c in w_out + contracted])
    sizes = list(shadow.shape[:len(w_out)])
    index = shadow.reshape(math.prod(sizes), -1)  # (O, E)
    rows = torch.arange(index.shape[0]).view(*[sizes[w_out.index(c)] if c in w_out else 1 for c in out_idx])
    return Product(w_origin, index, x, None, rows)


def _without_ellipsis(terms: list[str], out_idx: str, operands) -> tuple[list[str], str]:
    """einsum terms with every "..." spelled out as letters of their own ("...i,oi->...o" on a 3-D x:
    "ABi,oi->ABo"), the broadcast dimensions aligned from the right."""
    if not any("..." in t for t in terms + [out_idx]):
        return terms, out_idx
    free = [c for c in string.ascii_letters if c not in "".join(terms) + out_idx]
    counts = [t.dim() - (len(term) - 3) if "..." in term else 0 for term, t in zip(terms, operands)]
    letters = "".join(free[:max(counts)])
    spelled = [term.replace("...", letters[len(letters) - n:]) for term, n in zip(terms, counts)]
    return spelled, out_idx.replace("...", letters)


def rows_of_bias(out_rows: torch.Tensor, bias_elements: torch.Tensor, out_features: int) -> torch.Tensor | None:
    """The bias element of every output row (O,), when ``out + bias`` adds one element per row; else None."""
    try:
        rows, elements = torch.broadcast_tensors(out_rows, bias_elements)
    except RuntimeError:
        return None
    if rows.shape != out_rows.shape:
        return None
    found = torch.full((out_features,), -1, dtype=torch.long)
    found[rows.reshape(-1)] = elements.reshape(-1)
    if (found < 0).any() or not torch.equal(found[rows.reshape(-1)], elements.reshape(-1)):
        return None
    return found
