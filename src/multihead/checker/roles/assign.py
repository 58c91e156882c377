"""Which of the learner's projections (``projections.py``) projects queries, keys, values and the output.

Names are not trusted (``to_q``, ``lin_a``, ``fq`` all occur). ``ProjectionInputs`` watches one call: the
query, key or value input each projection reads (by provenance, or by element sum), an intermediate
tensor, or nothing, and the pieces each projection's output is used in (the dataflow: a fused qkv's q, k
and v, evenly split or not; each head's [0:R] and [R:D] when RoPE turns part of a head). That narrows the
roles down to a few candidate assignments (``role_candidates``: the order of three same-shaped layers,
how a fused projection is cut, how many heads, a small Linear shared by all heads, an inner
nn.MultiheadAttention); ``candidate_roles`` lists them all and the checker keeps the one whose outputs agree.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
from torch import nn

from multihead.checker.roles.projections import Projection, ProjectionInputs, find_projections
from multihead.checker.roles.candidates import (ROLES, attention_module_candidates, observed_cuts, qkv_candidates,
                                               self_candidates, shared_heads)
from multihead.convert.flow_roles import Piece as FlowPiece

Piece = tuple[Projection, object]  # (a projection, rows: None = all, a slice, or an index tensor)


@dataclass
class Weights:
    """Projection weights in the reference layout: q (H*D, Eq), k/v (Hkv*D, Ek/Ev), each with its bias or
    None; o (O, H*D) or None (no output projection)."""

    q: tuple
    k: tuple
    v: tuple
    o: tuple | None
    num_heads: int
    rope: object = None  # a rotary.Rotary turning q and k, or None

    @property
    def head_dim(self) -> int:
        return self.q[0].shape[0] // self.num_heads

    @property
    def num_kv_heads(self) -> int:
        """Hkv < H when groups of query heads share key/value heads (GQA)."""
        return self.k[0].shape[0] // self.head_dim


@dataclass
class RoleAssignment:
    """Where each role's rows live in the learner's module, for one head count."""

    pieces: dict[str, list[Piece]]  # "q"/"k"/"v" -> pieces stacked along output rows; "o" -> 0 or 1
    num_heads: int
    style: str  # "separate", "fused", "fused-per-head", "per-head", "fused-kv"
    labels: dict[str, str] = field(default_factory=dict)  # role -> description overriding the pieces'
    rope: object = None  # a rotary.Rotary the module turns q and k with, or None
    rotary_dim: int | None = None  # R when the dataflow shows each q and k head used as [0:R] and [R:D]

    def weights(self, module: nn.Module | None = None) -> Weights:
        """The current parameters (differentiable views of the learner's own tensors)."""
        qkv = [_stack([_rows(proj, rows) for proj, rows in self.pieces[r]]) for r in ROLES]
        out = self.pieces.get("o") or []
        o = _rows(*out[0]) if out else None
        rope = self.rope if self.rope is None or self.rotary_dim is None else replace(self.rope,
                                                                                       rotary_dim=self.rotary_dim)
        return Weights(*qkv, o=o, num_heads=self.num_heads, rope=rope)

    def describe(self) -> dict[str, str]:
        """Role -> where it lives, e.g. {"q": "c_attn rows 0:16", "o": "(none)"}."""
        described = {}
        for role in (*ROLES, "o"):
            pieces = self.pieces.get(role) or []
            if role in self.labels:
                described[role] = self.labels[role]
                continue
            names = sorted({proj.name for proj, _ in pieces})
            if not pieces:
                described[role] = "(none)"
            elif len(pieces) > 1:
                described[role] = f"{len(pieces)} per-head Linears: " + ", ".join(names)
            else:
                described[role] = names[0] + _rows_text(pieces[0][1])
        return described


def _rows_text(rows) -> str:
    if rows is None:
        return ""
    return f" rows {rows.start}:{rows.stop}"


def _row_count(proj: Projection, rows) -> int:
    if rows is None:
        return proj.out_features
    if isinstance(rows, slice):
        return len(range(proj.out_features)[rows])
    return len(rows)


def _rows(proj: Projection, rows) -> tuple:
    """(weight[rows], bias[rows] or None) of one projection."""
    weight, bias = proj.weight_bias()
    if rows is None:
        return weight, bias
    return weight[rows], None if bias is None else bias[rows]


def _stack(parts: list[tuple]) -> tuple:
    """Stack (weight, bias) pieces along the output rows; a missing bias counts as zeros."""
    weight = torch.cat([w for w, _ in parts]) if len(parts) > 1 else parts[0][0]
    if all(b is None for _, b in parts):
        return weight, None
    biases = [b if b is not None else w.new_zeros(w.shape[0]) for w, b in parts]
    return weight, torch.cat(biases)


def linear_layers(module: nn.Module) -> dict[str, Projection]:
    """Name -> projection (Linear, Conv1D, an inner nn.MultiheadAttention's in-projection), in order."""
    return find_projections(module)


LinearInputs = ProjectionInputs  # records what each projection sees (see projections.py)


def _heads_fit(rows: dict[str, int], num_heads: int) -> bool:
    """Do q rows H*D and k, v rows Hkv*D each (Hkv dividing H) make heads of one size D?"""
    head_dim = rows["q"] // num_heads
    if head_dim == 0 or rows["k"] != rows["v"] or rows["k"] % head_dim:
        return False
    kv_heads = rows["k"] // head_dim
    return kv_heads > 0 and num_heads % kv_heads == 0


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _rotary_dim(pieces: dict[str, list], observed: dict[str, list[FlowPiece]]) -> int | None:
    """R when the observed pieces holding q and k are both used as [0:R] and [R:D] of every head."""
    found = set()
    for role in ("q", "k"):
        if len(pieces[role]) != 1:
            return None
        name, rows = pieces[role][0]
        wanted = None if rows is None else torch.arange(rows.start, rows.stop) if isinstance(rows, slice) else rows
        match = [p for p in observed.get(name, []) if wanted is None or torch.equal(p.rows, wanted.sort().values)]
        if len(match) != 1 or (wanted is None and len(observed[name]) != 1):
            return None
        found.add(match[0].split)
    return found.pop() if len(found) == 1 else None


def candidate_roles(module: nn.Module, seen: dict[str, list[str]], self_attention: bool,
                    num_heads: int | None, widths: dict[str, int] | None = None,
                    watched: ProjectionInputs | None = None) -> list[RoleAssignment]:
    """Every plausible role assignment, given what each projection saw (see ``ProjectionInputs``);
    ``widths``: tag -> the width of that input (to find a small Linear shared by all heads); ``watched``:
    the ProjectionInputs of that call, for the projections seen only in it and the pieces of each output."""
    projections = linear_layers(module)  # (again: a LazyLinear never called is materialised by now)
    if watched is not None:
        projections.update({n: p for n, p in watched.projections.items() if p.kind == "traced"})
    observed = {} if watched is None else watched.pieces
    layers = shared_heads(projections, seen, widths or {})
    inputs = [n for n in layers if seen.get(n) and "mid" not in seen[n]]
    mids = [n for n in layers if "mid" in seen.get(n, [])]
    unused = [n for n in layers if n not in seen]
    shared = {p.heads for p in layers.values() if p.heads > 1}
    cuts = observed_cuts(layers, observed)

    def heads(inner: int) -> list[int]:
        if len(shared) == 1:  # a Linear shared by H heads fixes H
            return list(shared)
        if num_heads and inner % num_heads == 0:
            return [num_heads]
        return [h for h in _divisors(inner) if h > 1] + [1]  # one head last

    found = (attention_module_candidates(layers, seen)
             or (self_candidates(layers, inputs, unused, heads, cuts) if self_attention
                 else qkv_candidates(layers, seen, unused, heads, cuts)))
    assignments = []
    for pieces, h, style, labels in found:
        rows = {role: sum(_row_count(layers[n], r) for n, r in pieces[role]) for role in ROLES}
        if not _heads_fit(rows, h):
            continue
        taken = {name for role in ROLES for name, _ in pieces[role]}
        inner = rows["q"]
        if "o" in pieces:
            outs = [pieces["o"]]
        elif mids:
            outs = [[(mids[-1], None)]]
        else:
            spare = [n for n in unused if n not in taken and layers[n].in_features == inner]
            # an output layer defined but never called is still the output layer (no-output-projection)
            outs = [[(n, None)] for n in spare] or [[]]
        rotary_dim = _rotary_dim(pieces, observed)
        for out in outs:
            placed = {role: [(layers[n], r) for n, r in part] for role, part in {**pieces, "o": out}.items()}
            assignments.append(RoleAssignment(placed, h, style, labels, rotary_dim=rotary_dim))
    return assignments
