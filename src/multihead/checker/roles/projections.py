"""The learner's learned projections, whatever layer holds them: y = x @ W^T + b in the reference layout.

* ``nn.Linear`` (LazyLinear once materialised): weight (out, in);
* GPT-2's ``Conv1D`` and any look-alike: a leaf layer with weight (in, out) and bias (out,) that computes
  x @ W + b (checked by calling it once, not by its name);
* ``nn.MultiheadAttention`` inside the learner's module: its in-projection rows (or q/k/v_proj_weight)
  are three projections, fed by the query, key and value arguments of that call; its out_proj is a Linear;
* Linear layers never called because ``F.multi_head_attention_forward`` is handed their weights (the
  style of fairseq's fast path): the call's query, key and value arguments are what they project;
* a leaf layer of the learner's own whose weight (out, in) it applies with ``F.linear`` (a custom ``Linear``);
* one ``Linear(D, D)`` shared by all H heads after the split (found later, in ``roles``): the same as a
  block-diagonal Linear(H*D, H*D), see ``shared_across_heads``;
* any other linear map of a parameter seen during the call (``multihead.convert.dataflow``): a raw
  ``nn.Parameter`` used with ``@``, ``matmul`` or ``einsum`` in either orientation (kind "traced").

``ProjectionInputs`` watches one call with ``dataflow.Flow``: which tagged input each projection read (by
provenance; by element sum, which survives transposes and reshapes, where provenance cannot tell), or "mid"
for an intermediate tensor, and which pieces of each projection's output were used apart (a fused q, k, v).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from multihead.convert.dataflow import Flow, LinearMap
from multihead.convert.leaf_layout import leaf_layout
from multihead.convert.flow_roles import Piece, map_pieces


@dataclass(eq=False)
class Projection:
    """One projection: where it lives (``layer``) and how to read (weight (out, in), bias) from it."""

    name: str  # for the report, e.g. "c_attn" or "attn.in_proj_weight rows 16:32"
    layer: nn.Module  # the module whose calls are watched
    in_features: int
    out_features: int
    kind: str = "linear"  # "linear", "conv1d" (weight (in, out)), "in_proj" (rows of an nn.MultiheadAttention),
    # "traced" (a linear map of a parameter seen during a call: ``traced``)
    role: int | None = None  # in_proj: which argument of the attention call it projects (0 q, 1 k, 2 v)
    heads: int = 1  # > 1: one small Linear applied to each of ``heads`` slices of the input
    traced: LinearMap | None = None

    @property
    def weight_name(self) -> str:
        """The qualified name of the parameter holding the weight (to find it again in a copy)."""
        if self.kind == "traced":
            return self.traced.weight.name
        return f"{self.name}.weight" if self.kind != "in_proj" else self.name

    def weight_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(weight (out, in), bias (out,) or None): differentiable views of the learner's parameters."""
        if self.kind == "in_proj":
            return _in_proj(self.layer, self.role)
        if self.kind == "traced":
            weight, bias = self.traced.weight_bias()
        else:
            weight, bias = self.layer.weight, self.layer.bias
        if self.kind == "conv1d":
            weight = weight.t()
        if self.heads > 1:  # the same Linear on each head's slice: block-diagonal
            weight = torch.block_diag(*[weight] * self.heads)
            bias = None if bias is None else bias.repeat(self.heads)
        return weight, bias


def _in_proj(mha: nn.MultiheadAttention, role: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    E = mha.embed_dim
    if mha.in_proj_weight is not None:
        weight = mha.in_proj_weight[role * E:(role + 1) * E]
    else:
        weight = (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)[role]
    bias = None if mha.in_proj_bias is None else mha.in_proj_bias[role * E:(role + 1) * E]
    return weight, bias


def _applies(proj: Projection, found: LinearMap) -> bool:
    """Does the traced map apply this Linear's (or Conv1D's) whole weight, in its own layout, and its bias?"""
    weight = proj.layer.weight
    if found.weight.parameter is not weight:
        return False
    natural = torch.arange(weight.numel()).view(weight.shape)
    if not torch.equal(found.weight.index, natural.t() if proj.kind == "conv1d" else natural):
        return False
    bias = proj.layer.bias
    if bias is None or found.bias is None:
        return bias is None and found.bias is None
    return found.bias.parameter is bias and torch.equal(found.bias.index, torch.arange(bias.numel()))


def _numbered(name: str, taken) -> str:
    """``name (2)``, ``name (3)``...: the first not in ``taken``."""
    return next(f"{name} ({n})" for n in range(2, len(taken) + 3) if f"{name} ({n})" not in taken)


def shared_across_heads(proj: Projection, width: int) -> Projection:
    """``proj`` seen on inputs ``width`` wide although it takes ``in_features``: one Linear per head slice."""
    heads = width // proj.in_features
    return replace(proj, in_features=width, out_features=proj.out_features * heads, heads=heads,
                   name=f"{proj.name} (shared by {heads} heads)")


def describe_seen(projections: dict[str, Projection], seen: dict[str, list[str]]) -> str:
    """"c_attn (16 -> 48) <- x; c_proj (16 -> 16) <- mid; spare (8 -> 8) <- -": what each projection read."""
    if not projections:
        return "-"
    return "; ".join(f"{name} ({p.in_features} -> {p.out_features}) <- {'/'.join(dict.fromkeys(seen.get(name, ['-'])))}"
                     for name, p in projections.items())


def _same(given, weight: torch.Tensor) -> bool:
    """Is ``given`` (an argument of the functional attention call) this layer's weight?"""
    return isinstance(given, torch.Tensor) and given.shape == weight.shape and torch.equal(given.detach(), weight)


def find_projections(module: nn.Module) -> dict[str, Projection]:
    """Name -> Projection for every projection inside ``module``, in registration order."""
    found: dict[str, Projection] = {}
    for name, layer in module.named_modules():
        if isinstance(layer, nn.MultiheadAttention):
            E, prefix = layer.embed_dim, f"{name}." if name else ""
            ins = (E, layer.kdim, layer.vdim)
            for role, label in enumerate("qkv"):
                rows = f"{prefix}in_proj_weight rows {role * E}:{(role + 1) * E}" if layer.in_proj_weight is not None \
                    else f"{prefix}{label}_proj_weight"
                found[rows] = Projection(rows, layer, ins[role], E, "in_proj", role)
        elif isinstance(layer, nn.Linear):
            if not isinstance(layer.weight, nn.UninitializedParameter):
                found[name] = Projection(name, layer, layer.in_features, layer.out_features)
        elif (layout := leaf_layout(layer)) == "linear":
            found[name] = Projection(name, layer, layer.weight.shape[1], layer.weight.shape[0])
        elif layout == "conv1d":
            found[name] = Projection(name, layer, layer.weight.shape[0], layer.weight.shape[1], "conv1d")
    return found


class ProjectionInputs:
    """Context manager recording, per projection, which tagged tensor it was called on ("mid" otherwise),
    how wide that input was, and the pieces its output was used in (``pieces``: name -> [Piece], from its
    first call). ``tags`` maps a tag ("x", or "q"/"k"/"v") to its input tensor. Projections seen only in
    the call (raw parameters...) are added to ``projections``."""

    def __init__(self, module: nn.Module, tags: dict[str, torch.Tensor],
                 projections: dict[str, Projection] | None = None):
        self.projections = dict(find_projections(module) if projections is None else projections)
        self.tags = tags
        self.sums = {tag: float(t.detach().double().sum()) for tag, t in tags.items()}
        self.seen: dict[str, list[str]] = {}
        self.widths: dict[str, int] = {}
        self.input_sums: dict[str, float] = {}  # projection -> the sum of what it was called on
        self.leaves: dict[str, tuple[str, float]] = {}  # other leaf layer -> (its input's tag, its output's sum)
        self.pieces: dict[str, list[Piece]] = {}
        self.map_names: list[str] = []  # the projection applying each of the flow's maps, in call order
        self.module = module
        self.flow: Flow | None = None
        self._handles = []

    def _tag(self, tensor) -> str:
        """The tag of the input ``tensor`` is (by provenance, else by element sum), or "mid"."""
        if not isinstance(tensor, torch.Tensor):
            return "mid"
        origin = None if self.flow is None else self.flow.origin(tensor)
        if origin is not None and origin.kind == "input" and origin.source in self.tags and \
                torch.equal(torch.unique(origin.shadow), torch.arange(self.tags[origin.source].shape[-1])):
            return origin.source
        total = float(tensor.detach().double().sum())
        for tag, expected in self.sums.items():
            if abs(total - expected) <= 1e-6 * (1.0 + abs(expected)):
                return tag
        return "mid"

    def _record(self, name: str, tensor, width: int | None = None) -> None:
        self.seen.setdefault(name, []).append(self._tag(tensor))
        if isinstance(tensor, torch.Tensor):
            self.widths[name] = tensor.shape[-1] if width is None else width
            self.input_sums[name] = float(tensor.detach().double().sum())

    def _read_flow(self) -> None:
        """Record every linear map the call applied, under its projection's name (a new one if needed)."""
        pieces = map_pieces(self.flow.records)
        for index, found in enumerate(self.flow.maps):
            name = self._projection_of(found)
            self.map_names.append(name)
            self._record(name, found.read, found.in_features)
            self.pieces.setdefault(name, pieces.get(index, []))

    def _projection_of(self, found: LinearMap) -> str:
        """The name of the projection applying ``found`` (a Linear, Conv1D, or one traced from the call)."""
        for name, proj in self.projections.items():
            if proj.kind in ("linear", "conv1d") and _applies(proj, found):
                return name
            if proj.kind == "traced" and proj.traced.weight.name == found.weight.name and \
                    torch.equal(proj.traced.weight.index, found.weight.index):
                return name
        name = found.name if found.name not in self.projections else _numbered(found.name, self.projections)
        self.projections[name] = Projection(name, self.module, found.in_features, found.out_features, "traced",
                                            traced=found)
        return name

    def _watch_leaves(self) -> None:
        """Leaf layers that are not projections (a LayerNorm before the attention, say)."""
        layers = {id(p.layer) for p in self.projections.values()}
        for name, layer in self.module.named_modules():
            if list(layer.children()) or id(layer) in layers or not name:
                continue

            def hook(mod, inputs, output, name=name):
                if inputs and isinstance(output, torch.Tensor):
                    self.leaves[name] = (self._tag(inputs[0]), float(output.detach().double().sum()))
            self._handles.append(layer.register_forward_hook(hook))

    def __enter__(self) -> ProjectionInputs:
        attention_calls = {}
        for name, proj in self.projections.items():
            if proj.kind == "in_proj":
                attention_calls.setdefault(id(proj.layer), (proj.layer, []))[1].append(name)
        for layer, names in attention_calls.values():  # nn.MultiheadAttention: its query, key, value arguments
            def pre_hook(mod, args, kwargs, names=names):
                given = list(args) + [kwargs.get(k) for k in ("query", "key", "value")[len(args):]]
                for name in names:
                    self._record(name, given[self.projections[name].role])
            self._handles.append(layer.register_forward_pre_hook(pre_hook, with_kwargs=True))
        self._watch_leaves()
        self._watch_functional()
        self.flow = Flow(self.module, self.tags)
        self.flow.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.flow.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        F.multi_head_attention_forward = self._functional
        if exc[0] is None:
            self._read_flow()

    def _watch_functional(self) -> None:
        """``F.multi_head_attention_forward`` given Linear layers' weights (fairseq's fast path): those
        Linears are never called, so each is recorded as reading the argument its weight projects."""
        self._functional = original = F.multi_head_attention_forward
        inner = {id(m.out_proj) for m in self.module.modules() if isinstance(m, nn.MultiheadAttention)}
        linears = {name: p for name, p in self.projections.items() if p.kind == "linear" and id(p.layer) not in inner}

        def watched(query, key, value, embed_dim, num_heads, in_proj_weight, *args, **kwargs):
            by_role = [kwargs.get(f"{r}_proj_weight") for r in "qkv"]
            if not kwargs.get("use_separate_proj_weight") and isinstance(in_proj_weight, torch.Tensor):
                by_role = list(in_proj_weight.chunk(3)) if in_proj_weight.numel() else by_role
            out_weight = kwargs.get("out_proj_weight", args[5] if len(args) > 5 else None)
            for name, proj in linears.items():
                weight = proj.layer.weight.detach()
                for given, tensor in zip(by_role, (query, key, value)):
                    if _same(given, weight):
                        self._record(name, tensor)
                if _same(out_weight, weight):
                    self._record(name, None)
            return original(query, key, value, embed_dim, num_heads, in_proj_weight, *args, **kwargs)

        F.multi_head_attention_forward = watched

    def transformed_inputs(self) -> dict[str, str]:
        """Tag -> the leaf layer whose output the projections read instead of that input (e.g. a
        LayerNorm applied to x inside the module), for inputs that no projection reads directly."""
        read = {tag for tags in self.seen.values() for tag in tags}
        found = {}
        for tag in self.sums:
            if tag in read:
                continue
            for name, (source, total) in self.leaves.items():
                if source == tag and any(abs(total - s) <= 1e-6 * (1.0 + abs(s)) for s in self.input_sums.values()):
                    found[tag] = name
                    break
        return found
