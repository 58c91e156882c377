"""Roles from the dataflow: every linear map applied to a module's parameters during one call, and where
every tensor of that call came from.

``Flow`` is a ``torch.overrides.TorchFunctionMode``: it sees every torch function the module calls, with
its inputs and outputs, whatever code calls it (an nn.Linear, a class of the learner's own that calls
``F.linear``, ``x @ self.W``, ``torch.einsum("bld,hdk->bhlk", x, self.W)``, GPT-2's ``torch.addmm``). Each
tracked tensor has an ``Origin``: an input of the call, a parameter, the output of a linear map, or
something derived from those. Ops that only move elements (views, transposes, splits, slices, casts) keep
the origin and carry a *shadow*: an int64 tensor of the same shape holding, for every element, the feature
(inputs), the element (parameters) or the output row (linear maps) it is. So the shadow of ``q`` after
``qkv.split([H*D, Hkv*D, Hkv*D], -1)``, a view and a transpose tells exactly which rows of the fused
weight it holds, for uneven splits and per-head layouts alike.

An op that computes (a product, a softmax, a norm, RoPE's multiplications) *uses* the map outputs it reads:
``Use`` records which rows. ``flow_roles`` groups those uses into the pieces of each map (q, k, v of a
fused projection) and names the roles the attention maths gives them.

A linear map's weight is stored as (parameter, index): ``weight = parameter.reshape(-1)[index]``, index
(out, in); its bias likewise (out,). Shapes: E input features, O output rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from multihead.convert.dataflow_ops import (CONTRACTIONS, JOINS, KEEPS, LINEAR_FUNCS, MOVES, SHAPE_REFERENCES,
                                            einsum_map, flat_tensors, map_of_product, rows_of_bias)


@dataclass(eq=False)
class Origin:
    """Where a tensor came from: ``kind`` "input" (``source`` its tag), "param" (its name), "map" (the
    index of a linear map) or "derived" (``source`` None); ``shadow`` (int64, the tensor's shape) for the
    first three; ``ancestry``: the inputs, parameters, maps, uses and products it depends on; ``near``
    (derived): the uses it comes from through element-wise ops only (no product in between)."""

    kind: str
    source: object
    shadow: torch.Tensor | None
    ancestry: frozenset
    near: frozenset = frozenset()


@dataclass(eq=False)
class Weight:
    """Elements of one parameter laid out as a weight or a bias: ``parameter.reshape(-1)[index]``; of several
    parameters joined by a cat (``torch.cat([W_q, W_k, W_v])``, one matrix multiply for three): ``parameter``
    is then their tuple and ``index`` counts through their flattened elements one after the other."""

    name: str  # the parameter's qualified name, e.g. "wq.weight" or "W_q" ("W_q+W_k+W_v" for several)
    parameter: nn.Parameter | tuple[nn.Parameter, ...]
    index: torch.Tensor  # (O, E) for a weight, (O,) for a bias

    def tensor(self) -> torch.Tensor:
        """The elements, differentiable with respect to the parameter(s)."""
        if isinstance(self.parameter, tuple):
            return torch.cat([p.reshape(-1) for p in self.parameter])[self.index]
        return self.parameter.reshape(-1)[self.index]

    def scale_rows_(self, rows: torch.Tensor, factor: float) -> bool:
        """Multiply the elements of ``rows`` (of the (O, E) or (O,) layout) by ``factor``, in the parameters
        themselves; False (nothing changed) when a parameter is not contiguous (no flat view of it)."""
        parameters = self.parameter if isinstance(self.parameter, tuple) else (self.parameter,)
        if not all(p.is_contiguous() for p in parameters):
            return False
        elements = self.index[rows].reshape(-1)
        start = 0
        with torch.no_grad():
            for p in parameters:
                mine = elements[(elements >= start) & (elements < start + p.numel())] - start
                p.view(-1)[mine] *= factor
                start += p.numel()
        return True


@dataclass(eq=False)
class LinearMap:
    """One linear map y = x W^T + b applied during the call: weight (O, E), bias (O,) or None."""

    name: str  # the parameter's owner in the module, e.g. "wq" for wq.weight, "W_q" for a raw parameter
    weight: Weight
    bias: Weight | None
    reads: Origin  # the origin of what it read
    read: torch.Tensor  # what it read (its E features on one axis, or several read together)
    output: torch.Tensor

    @property
    def out_features(self) -> int:
        return self.weight.index.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.index.shape[1]

    def weight_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight (O, E), bias (O,) or None): differentiable views of the parameters."""
        return self.weight.tensor(), None if self.bias is None else self.bias.tensor()


@dataclass(eq=False)
class Use:
    """Rows of a map's output read by an op that computes: ``rows`` sorted (n,), ``width`` the last axis of
    what the op read, ``op`` its name."""

    map: int
    rows: torch.Tensor
    width: int
    op: str


@dataclass
class Contraction:
    """A product of tracked tensors without a parameter in it (scores, weights times values, sdpa):
    ``operands`` the ancestry of each tensor argument (None: untracked), ``output`` the id of its result."""

    op: str
    operands: list[frozenset | None]
    output: int
    equation: str | None = None


def _index(t: torch.Tensor) -> torch.Tensor:
    return torch.arange(t.numel()).view(t.shape)


def _features(t: torch.Tensor) -> torch.Tensor:
    """Feature index along the last axis, broadcast to t's shape."""
    return torch.arange(t.shape[-1]).expand(t.shape) if t.dim() else torch.zeros((), dtype=torch.long)


def _name(func) -> str:
    return getattr(func, "__name__", str(func))


@dataclass
class Records:
    """What one call did: its linear maps, the uses of their outputs, uses joined side by side, products."""

    maps: list[LinearMap] = field(default_factory=list)
    uses: list[Use] = field(default_factory=list)
    joins: list[tuple[int, int]] = field(default_factory=list)  # pairs of use ids joined by a cat
    contractions: list[Contraction] = field(default_factory=list)


class Flow(TorchFunctionMode):
    """Context manager: watch the calls made inside it on the tagged ``inputs`` (tag -> tensor) of
    ``module``; afterwards ``records`` and ``origin(tensor)`` say what happened."""

    def __init__(self, module: nn.Module, inputs: dict[str, torch.Tensor]):
        super().__init__()
        self.module = module
        self.names = {}
        for name, param in module.named_parameters():  # a LazyLinear's keeps its id once materialised
            self.names.setdefault(id(param), name)
        self._origins: dict[int, Origin] = {}
        self._alive: list[torch.Tensor] = []  # keeps every tracked tensor's id unique during the call
        self.records = Records()
        for tag, tensor in inputs.items():
            if isinstance(tensor, torch.Tensor) and id(tensor) not in self._origins:
                self._track(tensor, Origin("input", tag, _features(tensor), frozenset({("input", tag)})))

    @property
    def maps(self) -> list[LinearMap]:
        return self.records.maps

    @property
    def uses(self) -> list[Use]:
        return self.records.uses

    def _track(self, tensor: torch.Tensor, origin: Origin) -> None:
        self._origins[id(tensor)] = origin
        self._alive.append(tensor)

    def origin(self, tensor) -> Origin | None:
        """The origin of a tensor seen in the call (parameters included), or None."""
        if not isinstance(tensor, torch.Tensor):
            return None
        found = self._origins.get(id(tensor))
        if found is None and id(tensor) in self.names:
            name = self.names[id(tensor)]
            found = Origin("param", name, _index(tensor), frozenset({("param", name)}))
            self._track(tensor, found)
        return found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        try:
            self._observe(func, args, kwargs, out)
        except (RuntimeError, IndexError, TypeError, ValueError):  # a shadow that cannot follow: computed
            self._derive(func, args, kwargs, out)
        return out

    # --- what each kind of op does to origins --------------------------------------------------------

    def _observe(self, func, args, kwargs, out) -> None:
        if func is torch.Tensor.__setitem__:
            self._store(args)
            return
        if not flat_tensors(out):
            return
        operands = [t for t in flat_tensors((args, kwargs)) if self.origin(t) is not None]
        if not operands:
            return
        if func in LINEAR_FUNCS and self._linear(func, args, kwargs, out):
            return
        first = _first_tensor(args)
        if func in KEEPS and operands[0] is first and self.origin(first).kind != "derived":
            self._track(out, self.origin(first))
            return
        if func in MOVES and self._move(func, args, kwargs, out, operands):
            return
        if func in JOINS and self._join(func, args, kwargs, out):
            return
        if self._bias(func, args, out):
            return
        self._derive(func, args, kwargs, out)

    def _move(self, func, args, kwargs, out, operands) -> bool:
        """A view, transpose, split, slice...: the output keeps the first operand's origin, shadow moved."""
        first = _first_tensor(args)
        origin = self.origin(first)
        if origin is None or origin.kind == "derived" or first is not operands[0]:
            return False
        if func not in SHAPE_REFERENCES and any(t is not first for t in operands[1:]):
            return False  # e.g. an index tensor computed from the input itself
        return self._moved(func, (origin.shadow, *args[1:]), kwargs, out, origin)

    def _moved(self, func, shadow_args, kwargs, out, origin: Origin) -> bool:
        """Track ``out`` with ``origin``'s kind and source, its shadow ``func(*shadow_args)``."""
        with torch.no_grad():
            moved = flat_tensors(func(*shadow_args, **kwargs))
        outs = flat_tensors(out)
        if len(moved) != len(outs) or any(t.shape != m.shape for t, m in zip(outs, moved)):
            raise RuntimeError("a shadow of another shape")
        for tensor, shadow in zip(outs, moved):
            self._track(tensor, Origin(origin.kind, origin.source, shadow, origin.ancestry))
        return True

    def _join(self, func, args, kwargs, out) -> bool:
        """cat/stack: one source throughout moves like a view; mixed sources compute, and the uses of one
        map that end up side by side (RoPE's rotated half next to the part it leaves) are joined."""
        parts = list(args[0] if args else kwargs.get("tensors"))
        origins = [self.origin(t) for t in parts]
        keys = {None if o is None else (o.kind, o.source) for o in origins}
        if len(keys) == 1 and None not in keys and origins[0].kind != "derived":
            return self._moved(func, ([o.shadow for o in origins], *args[1:]), kwargs, out, origins[0])
        if all(o is not None and o.kind == "param" and isinstance(o.source, str) for o in origins):
            return self._joined_parameters(func, args, kwargs, out, origins)
        self._derive(func, args, kwargs, out)
        by_map: dict[int, list[int]] = {}
        for use in sorted(self.origin(flat_tensors(out)[0]).near):
            by_map.setdefault(self.uses[use].map, []).append(use)
        for uses in by_map.values():
            self.records.joins += [(uses[0], other) for other in uses[1:]]
        return True

    def _joined_parameters(self, func, args, kwargs, out, origins: list[Origin]) -> bool:
        """cat/stack of several parameters: one parameter made of them all (its source their names, its shadow
        counting through their elements one parameter after the other)."""
        names = list(dict.fromkeys(o.source for o in origins))
        sizes = [self.module.get_parameter(name).numel() for name in names]
        offsets = {name: sum(sizes[:i]) for i, name in enumerate(names)}
        joined = Origin("param", tuple(names), None, frozenset().union(*[o.ancestry for o in origins]))
        return self._moved(func, ([o.shadow + offsets[o.source] for o in origins], *args[1:]), kwargs, out, joined)

    def _parameter(self, source) -> nn.Parameter | tuple[nn.Parameter, ...]:
        """The parameter of a "param" origin (a tuple of them for parameters joined by a cat)."""
        if isinstance(source, tuple):
            return tuple(self.module.get_parameter(name) for name in source)
        return self.module.get_parameter(source)

    def _derive(self, func, args, kwargs, out) -> None:
        """An op that computes: its output depends on everything it read; map outputs it read are used."""
        read, near = [], set()  # read: per tensor argument, its ancestry with its own use (None: untracked)
        for tensor in flat_tensors((args, kwargs)):
            origin = self.origin(tensor)
            if origin is not None and origin.kind == "map":
                use = self._use(origin, tensor, func)
                read.append(origin.ancestry | {("use", use)})
                near.add(use)
            else:
                read.append(None if origin is None else origin.ancestry)
                near |= origin.near if origin is not None else set()
        ancestry = frozenset().union(*[r for r in read if r is not None])
        name = _name(func)
        contraction = func in CONTRACTIONS and isinstance(out, torch.Tensor) and not any(
            self.origin(t) is not None and self.origin(t).kind == "param" for t in flat_tensors(args))
        if contraction:  # a product: what comes out is no longer any piece side by side with another
            ancestry, near = ancestry | {("contraction", len(self.records.contractions))}, set()
            equation = args[0] if args and isinstance(args[0], str) else None
            self.records.contractions.append(Contraction(name, read[:len(flat_tensors(args))], id(out), equation))
        in_place = (name.endswith("_") and not name.endswith("__")) or name.startswith("__i")
        given = {id(t) for t in flat_tensors((args, kwargs))}
        for tensor in flat_tensors(out):
            if in_place or id(tensor) not in given:  # an op handing back its input unchanged keeps it
                self._track(tensor, Origin("derived", None, None, ancestry, frozenset(near)))

    def _store(self, args) -> None:
        """``buffer[...] = value`` (a cache write): the value is used; the buffer now depends on it."""
        target, value = args[0], args[2] if len(args) > 2 else None
        origin = self.origin(value)
        if origin is None:
            return
        ancestry = set(origin.ancestry)
        if origin.kind == "map":
            ancestry.add(("use", self._use(origin, value, torch.Tensor.__setitem__)))
        before = self.origin(target)
        self._track(target, Origin("derived", None, None,
                                   frozenset(ancestry | (before.ancestry if before else frozenset()))))

    def _use(self, origin: Origin, tensor: torch.Tensor, func) -> int:
        rows = torch.unique(origin.shadow)
        self.records.uses.append(Use(origin.source, rows, tensor.shape[-1] if tensor.dim() else 1, _name(func)))
        return len(self.uses) - 1

    def _linear(self, func, args, kwargs, out) -> bool:
        """A linear map of a tracked tensor by a parameter (or a view of one): record it; False otherwise."""
        found = einsum_map(args, self.origin) if func is torch.einsum else \
            map_of_product(func, args, kwargs, self.origin)
        if found is None or not isinstance(out, torch.Tensor):
            return False
        rows = found.rows.expand(out.shape)
        bias = None
        if found.bias is not None:
            bias_origin = self.origin(found.bias)
            if bias_origin.shadow.shape != found.index.shape[:1]:
                return False
            bias = Weight(_joined_name(bias_origin.source), self._parameter(bias_origin.source), bias_origin.shadow)
        reads = self.origin(found.read) or Origin("derived", None, None, frozenset())
        ancestry = reads.ancestry
        if reads.kind == "map":  # a map reading another map's output uses its rows
            ancestry = ancestry | {("use", self._use(reads, found.read, func))}
        index = len(self.maps)
        weight = Weight(_joined_name(found.param.source), self._parameter(found.param.source), found.index)
        self.records.maps.append(LinearMap(_owner(weight.name), weight, bias, reads, found.read, out))
        self._track(out, Origin("map", index, rows, frozenset({("map", index)}) | ancestry))
        return True

    def _bias(self, func, args, out) -> bool:
        """``x @ W + b`` (or ``b + x @ W``): b, a parameter, becomes the bias of the map just computed."""
        if _name(func) not in ("add", "__add__", "__radd__") or len(args) != 2:
            return False
        origins = [self.origin(a) for a in args]
        kinds = [None if o is None else o.kind for o in origins]
        if sorted(kinds, key=str) != ["map", "param"]:
            return False
        made, bias = (args[0], args[1]) if kinds[0] == "map" else (args[1], args[0])
        index = next((i for i, m in enumerate(self.maps) if m.output is made), None)
        if index is None or self.maps[index].bias is not None:
            return False
        found = self.maps[index]
        bias_origin = self.origin(bias)
        rows = rows_of_bias(self._origins[id(made)].shadow, bias_origin.shadow, found.out_features)
        if rows is None:
            return False
        found.bias = Weight(_joined_name(bias_origin.source), self._parameter(bias_origin.source), rows)
        found.output = out
        self._track(out, self._origins[id(made)])
        return True


def _first_tensor(args):
    tensors = flat_tensors(args[:1]) if args else []
    return tensors[0] if tensors else None


def _joined_name(source) -> str:
    """A parameter's name; "W_q+W_k+W_v" for parameters joined by a cat."""
    return "+".join(source) if isinstance(source, tuple) else source


def _owner(name: str) -> str:
    """"wq.weight" -> "wq"; a raw parameter keeps its own name ("W_q", "heads.0.W")."""
    owner, _, leaf = name.rpartition(".")
    return owner if owner and leaf in ("weight", "bias") else name
