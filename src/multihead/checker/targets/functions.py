"""A plain attention function, checked like a module: ``multihead check FILE.py:function``.

The function's signature says which of two kinds it is; either way it becomes an ``nn.Module`` class the
checker builds and judges like any learner's module (same ids, same report):

* an attention core ``fn(q, k, v, mask=None)``: SDPA style, q, k, v (B, H, L, D), or one head (B, L, D), and
  whatever the mask's convention is (found by behaviour, like a module's). ``core_class`` wraps it in
  multi-head attention whose projections the checker supplies: q, k, v projected and split into heads, the
  function, heads merged, an output projection;
* weights as arguments ``fn(x, w_q, w_k, w_v, w_o, num_heads, mask)`` (a course's adapter; also
  ``in_proj_weight``, biases, separate query/key/value): ``weights_class`` makes a module whose parameters are
  those weight arguments, named after them, so that the role finder reads which one projects what.

Shapes: E = 16 features and H = 4 heads unless the function's names say otherwise (names.guess_value).
"""

from __future__ import annotations

import inspect
import re

import torch
from torch import nn

from multihead.checker.loading.calling import first_tensor
from multihead.checker.loading.load_error import LoadError
from multihead.checker.loading.constructor_args import EMBED, HEADS, guess_value, is_dropout, is_head_count_name

INPUT_NAMES = {"q": ("q", "query", "queries", "Q", "xq", "q_in"), "k": ("k", "key", "keys", "K", "xk", "k_in"),
               "v": ("v", "value", "values", "V", "xv", "v_in"),
               "x": ("x", "inputs", "input", "hidden_states", "h", "X", "embeddings", "tokens", "seq", "in_features",
                     "input_features", "x_in", "features")}
MASK_WORDS = ("mask", "attn_bias", "attention_bias")
# a weight or bias argument: its role ("q", "k", "v", "o" or "qkv") read from its name
_ROLE = r"(?P<role>qkv|q|k|v|o|out|query|key|value|output)"
_WEIGHT = [re.compile(p, re.IGNORECASE) for p in (rf"^w_?{_ROLE}$", rf"^{_ROLE}_?(proj_)?(weight|w|mat)$",
                                                  rf"^weight_?{_ROLE}$", rf"^w{_ROLE}$")]
_BIAS = [re.compile(p, re.IGNORECASE) for p in (rf"^b_?{_ROLE}$", rf"^{_ROLE}_?(proj_)?bias$", rf"^bias_?{_ROLE}$")]
_PACKED = {"in_proj_weight": ("qkv", "weight"), "in_proj_bias": ("qkv", "bias"), "out_proj_weight": ("o", "weight"),
           "out_proj_bias": ("o", "bias")}
_ROLE_OF = {"query": "q", "key": "k", "value": "v", "out": "o", "output": "o"}


def weight_role(name: str) -> tuple[str, str] | None:
    """(role, "weight" or "bias") for a weight argument's name (w_q, W_K, q_weight, in_proj_bias...), or None."""
    if name in _PACKED:
        return _PACKED[name]
    for kind, patterns in (("weight", _WEIGHT), ("bias", _BIAS)):
        for pattern in patterns:
            found = pattern.match(name)
            if found:
                role = found.group("role").lower()
                return _ROLE_OF.get(role, role), kind
    return None


def is_function_target(obj) -> bool:
    """A plain function (not a class, not an nn.Module) to check as attention."""
    return inspect.isfunction(obj)


def function_class(fn) -> type[nn.Module]:
    """The module class that stands for ``fn`` (see the module docstring); LoadError when its signature
    fits neither kind."""
    params = list(inspect.signature(fn).parameters.values())
    if any(weight_role(p.name) for p in params):
        return weights_class(fn, params)
    return core_class(fn, params)


def _mask_param(params) -> inspect.Parameter | None:
    return next((p for p in params if any(word in p.name.lower() for word in MASK_WORDS)), None)


def fill_extras(fn, params, taken: set[str]) -> dict:
    """Values for the function's other required arguments, guessed by name (d_k, dropout...); LoadError when
    one cannot be guessed."""
    values = {}
    for p in params:
        if p.name in taken or p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        known, value = (True, 0.0) if is_dropout(p.name) else guess_value(p.name)
        if not known:
            raise LoadError(f"cannot guess the argument {p.name!r} of {fn.__name__}(); give it a default value",
                            f"无法猜出 {fn.__name__}() 的参数 {p.name!r}；请给它一个默认值")
        values[p.name] = value
    return values


def _signature(names: list[str], mask: inspect.Parameter | None) -> inspect.Signature:
    """forward's signature: self, the tensor inputs, and the function's own mask argument (its name, and
    required or not), so that the checker reads the mask as it reads a module's."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    params += [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
    if mask is not None:
        params.append(inspect.Parameter(mask.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=inspect.Parameter.empty if mask.default is mask.empty else None))
    return inspect.Signature(params)


def core_class(fn, params) -> type[nn.Module]:
    """A module class for an attention core ``fn(q, k, v[, mask])``: projections, heads, fn, merge, output."""
    tensors = [p for p in params if p.default is p.empty and p.kind != p.VAR_KEYWORD
               and not any(word in p.name.lower() for word in MASK_WORDS)][:3]
    if len(tensors) != 3:
        raise LoadError(f"{fn.__name__}() should take queries, keys and values (and a mask): fn(q, k, v, mask=None); "
                        f"its arguments are {', '.join(p.name for p in params) or 'none'}",
                        f"{fn.__name__}() 应接收查询、键、值（以及掩码）：fn(q, k, v, mask=None)；"
                        f"它的参数是 {', '.join(p.name for p in params) or '无'}")
    mask = _mask_param(params)
    extras = fill_extras(fn, params, {p.name for p in tensors} | ({mask.name} if mask else set()))
    heads_layout = _takes_heads(fn, [p.name for p in tensors], extras)

    class FunctionAttention(nn.Module):
        """``fn`` inside multi-head attention the checker supplies (q, k, v, output projections)."""

        def __init__(self, d_model: int, num_heads: int):  # filled by name (load.guess_init), so rebuilt too
            super().__init__()
            self.num_heads = num_heads if heads_layout else 1
            self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))

        def forward(self, query, key, value, *args, **kwargs):
            B, Lq, E = query.shape
            split = (lambda t: t.view(B, t.shape[1], self.num_heads, -1).transpose(1, 2)) if heads_layout \
                else (lambda t: t)  # (B, H, L, D) or (B, L, E)
            q, k, v = split(self.q_proj(query)), split(self.k_proj(key)), split(self.v_proj(value))
            given = dict(zip([p.name for p in tensors], (q, k, v)))
            if mask is not None:
                given[mask.name] = args[0] if args else kwargs.get(mask.name)
            out = first_tensor(fn(**given, **extras))
            out = out.transpose(1, 2).reshape(B, Lq, E) if heads_layout else out  # (B, Lq, E)
            return self.out_proj(out)

    FunctionAttention.forward.__signature__ = _signature(["query", "key", "value"], mask)
    FunctionAttention.__name__ = FunctionAttention.__qualname__ = fn.__name__
    FunctionAttention.checked_function = (fn.__name__, [p.name for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                                                and p.default is p.empty or p is mask],
                                  "(B, H, L, D)" if heads_layout else "(B, L, D)")
    return FunctionAttention


def _takes_heads(fn, names: list[str], extras: dict) -> bool:
    """Does ``fn`` take q, k, v as (B, H, L, D)? Else as (B, L, D); LoadError when it runs on neither."""
    gen = torch.Generator().manual_seed(0)
    for shape, heads in (((2, HEADS, 5, EMBED // HEADS), True), ((2, 5, EMBED), False)):
        tensors = [torch.randn(shape, generator=gen) for _ in names]
        try:
            out = first_tensor(fn(**dict(zip(names, tensors)), **extras))
        except Exception:
            continue
        if tuple(out.shape) == shape:
            return heads
    raise LoadError(f"{fn.__name__}(q, k, v) runs neither on (B, H, L, D) nor on (B, L, D) tensors, or returns "
                    f"another shape", f"{fn.__name__}(q, k, v) 在 (B, H, L, D) 和 (B, L, D) 的张量上都无法运行，"
                    f"或者返回的形状不对")


def weights_class(fn, params) -> type[nn.Module]:
    """A module class whose parameters are ``fn``'s weight arguments (named after them), and whose forward
    calls ``fn`` with them: ``fn(x, w_q, w_k, w_v, w_o, num_heads, mask)`` and the like."""
    roles = {p.name: weight_role(p.name) for p in params if weight_role(p.name)}
    mask = _mask_param(params)
    heads = next((p.name for p in params if is_head_count_name(p.name)), None)
    inputs = [p.name for p in params if p.name not in roles and p.name != heads and p is not mask
              and p.default is p.empty and any(p.name in names for names in INPUT_NAMES.values())]
    if len(inputs) not in (1, 3):
        raise LoadError(f"{fn.__name__}() takes weights as arguments, but not one input x or query, key, value; "
                        f"its arguments are {', '.join(p.name for p in params)}",
                        f"{fn.__name__}() 以权重作为参数，但输入既不是一个 x，也不是查询、键、值三个；"
                        f"它的参数是 {', '.join(p.name for p in params)}")
    extras = fill_extras(fn, params, set(roles) | set(inputs) | {heads, mask.name if mask else None})
    transposed = _weights_transposed(fn, roles, inputs, heads, extras)

    class WeightArguments(nn.Module):
        """``fn``'s weight arguments as parameters; forward passes them back to ``fn``."""

        def __init__(self, d_model: int, num_heads: int):  # filled by name (load.guess_init), so rebuilt too
            super().__init__()
            self.num_heads = num_heads
            gen = torch.Generator().manual_seed(1)
            for name, (role, kind) in roles.items():
                shape = _shape(role, kind, d_model, transposed)
                self.register_parameter(name, nn.Parameter(torch.randn(shape, generator=gen) * d_model ** -0.5))

        def forward(self, *tensors, **kwargs):
            given = dict(zip(inputs, tensors))
            given.update({name: getattr(self, name) for name in roles})
            if heads:
                given[heads] = self.num_heads
            if mask is not None:
                given[mask.name] = tensors[len(inputs)] if len(tensors) > len(inputs) else kwargs.get(mask.name)
            return fn(**given, **extras)

    WeightArguments.forward.__signature__ = _signature(inputs, mask)
    WeightArguments.__name__ = WeightArguments.__qualname__ = fn.__name__
    WeightArguments.checked_function = (fn.__name__, [p.name for p in params if p.default is p.empty or p is mask], None)
    return WeightArguments


def describe_function(report, cls: type) -> None:
    """The report of a function's check speaks of the function: its call in the first convention line and, for
    an attention core, its q, k, v shape instead of the projections the checker supplied."""
    name, args, shape = cls.checked_function
    first = ("function:core", {"call": name, "args": ", ".join(args), "shape": shape}) if shape else None
    report.conventions = [(first or (key, {**values, "call": name, "args": ", ".join(args)}))
                          if key.startswith("inputs:") else (key, values) for key, values in report.conventions
                          if not (shape and key.startswith(("layout:", "cross-lengths")))]  # the wrapper's, not fn's
    if shape:
        report.roles = {}


def _shape(role: str, kind: str, width: int, transposed: bool) -> tuple[int, ...]:
    """A weight argument's shape: (out, in) as F.linear takes it, (in, out) when ``transposed`` (x @ W)."""
    rows = 3 * width if role == "qkv" else width
    if kind == "bias":
        return (rows,)
    return (width, rows) if transposed else (rows, width)


def _weights_transposed(fn, roles: dict, inputs: list[str], heads: str | None, extras: dict) -> bool:
    """Does ``fn`` multiply its inputs by the weights as x @ W, W (in, out)? Tried on random tensors: a packed
    qkv weight runs in one orientation only (square weights run in both: then F.linear's, (out, in))."""
    gen = torch.Generator().manual_seed(2)
    for transposed in (False, True):
        given = {name: torch.randn(_shape(role, kind, EMBED, transposed), generator=gen)
                 for name, (role, kind) in roles.items()}
        given.update({name: torch.randn(2, 5, EMBED, generator=gen) for name in inputs})
        if heads:
            given[heads] = HEADS
        try:
            out = first_tensor(fn(**given, **extras))
        except Exception:
            continue
        if tuple(out.shape) == (2, 5, EMBED):
            return transposed
    raise LoadError(f"{fn.__name__}() does not run with {EMBED}-wide inputs and square weight arguments",
                    f"{fn.__name__}() 在 {EMBED} 维的输入和方阵权重参数下无法运行")
