"""Which of the learner's projections (``projections.py``) projects queries, keys, values and the output.

Names are not trusted (``to_q``, ``lin_a``, ``fq`` all occur). Forward hooks record what each projection
sees during one call: the query, key or value input (recognised by its element sum, which survives
transposes and reshapes), an intermediate tensor, or nothing. That narrows the roles down to a few
candidate assignments (the order of three same-shaped layers, how a fused ``Linear(E, 3E)`` is cut,
how many heads, a small Linear shared by all heads, an inner nn.MultiheadAttention);
``candidate_roles`` lists them all and the checker keeps the one whose outputs agree.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

import torch
from torch import nn

from multihead.checker.projections import Projection, ProjectionInputs, find_projections, shared_across_heads

ROLES = ("q", "k", "v")
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

    def weights(self, module: nn.Module | None = None) -> Weights:
        """The current parameters (differentiable views of the learner's own tensors)."""
        qkv = [_stack([_rows(proj, rows) for proj, rows in self.pieces[r]]) for r in ROLES]
        out = self.pieces.get("o") or []
        o = _rows(*out[0]) if out else None
        return Weights(*qkv, o=o, num_heads=self.num_heads, rope=self.rope)

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


def _head_index(name: str) -> int | None:
    """The first integer path component ("heads.2.W_query" -> 2, "to_q.1" -> 1), or None."""
    found = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
    return int(found.group(1)) if found else None


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _per_head_groups(names: list[str]) -> list[list[str]] | None:
    """Group Linears by head index when there are 3 per head (stacked heads), else None."""
    by_head: dict[int, list[str]] = {}
    for name in names:
        index = _head_index(name)
        if index is None:
            return None
        by_head.setdefault(index, []).append(name)
    if len(by_head) < 2 or sorted(by_head) != list(range(len(by_head))):
        return None
    if any(len(group) != 3 for group in by_head.values()):
        return None
    return [by_head[h] for h in range(len(by_head))]


def _permuted(three: list[list[Piece]], style: str, heads_of) -> list[tuple]:
    """(pieces, heads, style, labels) for every order of three role slots, and every head count
    ``heads_of(query pieces)`` allows."""
    return [({role: three[i] for role, i in zip(ROLES, order)}, h, style, {})
            for order in itertools.permutations(range(3)) for h in heads_of(three[order[0]])]


def _fused_kv(layers, q_name: str, kv_name: str, heads) -> list[tuple]:
    """A query Linear and one Linear(E, 2 * inner) whose halves are keys and values (either order)."""
    inner = layers[q_name].out_features
    if layers[kv_name].out_features != 2 * inner:
        return []
    halves = [[(kv_name, slice(0, inner))], [(kv_name, slice(inner, 2 * inner))]]
    return [({"q": [(q_name, None)], "k": halves[i], "v": halves[1 - i]}, h, "fused-kv", {})
            for i in (0, 1) for h in heads(inner)]


def _fused(layers, name: str, heads) -> list[tuple]:
    """One Linear(E, 3 * inner): its thirds in every order, or rows laid out per head as (H, 3, D)."""
    out = layers[name].out_features
    if out % 3:
        return []
    inner = out // 3
    thirds = [[(name, slice(i * inner, (i + 1) * inner))] for i in range(3)]
    found = _permuted(thirds, "fused", lambda _: heads(inner))
    for h in heads(inner):
        rows = torch.arange(out).view(h, 3, inner // h)  # (H, 3, D): head h's q, k, v rows side by side
        found.append(({role: [(name, rows[:, i].reshape(-1))] for i, role in enumerate(ROLES)}, h,
                      "fused-per-head",
                      {role: f"{name} rows viewed as (H={h}, 3, D)[:, {i}]" for i, role in enumerate(ROLES)}))
    return found


def _self_candidates(layers, inputs, unused, heads) -> list[tuple]:
    """Role candidates when one tensor x feeds every projection."""
    groups = _per_head_groups(inputs)
    if groups:  # stacked heads: head h owns groups[h], three Linears in some order
        three = [[(group[i], None) for group in groups] for i in range(3)]
        return _permuted(three, "per-head", lambda _: [len(groups)])
    if len(inputs) == 1:
        return _fused(layers, inputs[0], heads)
    if len(inputs) == 2:
        q_name, kv_name = sorted(inputs, key=lambda n: layers[n].out_features)
        found = _fused_kv(layers, q_name, kv_name, heads)
        if found:
            return found
    names = list(inputs)
    if not names:
        return []
    spare = [n for n in unused if layers[n].in_features == layers[names[0]].in_features]
    while len(names) < 3 and spare:  # a projection defined but never used (e.g. values)
        names.append(spare.pop(0))
    if len(names) != 3:
        return []
    return _permuted([[(n, None)] for n in names], "separate", lambda q: heads(layers[q[0][0]].out_features))


def _qkv_candidates(layers, seen, unused, heads) -> list[tuple]:
    """Role candidates when query, key and value come in as separate tensors."""
    by_role = {role: [n for n in layers if role in seen.get(n, [])] for role in ROLES}
    if not by_role["v"] and len(by_role["q"]) == 1:  # forward(x, context): keys = values
        q_name, on_context = by_role["q"][0], by_role["k"]
        if len(on_context) == 1:  # one fused to_kv
            found = _fused_kv(layers, q_name, on_context[0], heads)
            if found:
                return found
        if len(on_context) == 2:  # a key Linear and a value Linear, in either order
            return [({"q": [(q_name, None)], "k": [(k, None)], "v": [(v, None)]}, h, "separate", {})
                    for k, v in (on_context, on_context[::-1]) for h in heads(layers[q_name].out_features)]
    for role in ROLES:
        if not by_role[role]:
            shape = next((_shape(layers[by_role[r][0]]) for r in ROLES if by_role[r]), None)
            spare = [n for n in unused if _shape(layers[n]) == shape]
            if not spare:
                return []
            by_role[role] = [spare[0]]
    pieces = {role: [(n, None) for n in by_role[role]] for role in ROLES}
    if len(by_role["q"]) > 1:
        return [(pieces, len(by_role["q"]), "per-head", {})]
    return [(pieces, h, "separate", {}) for h in heads(layers[by_role["q"][0]].out_features)]


def _heads_fit(rows: dict[str, int], num_heads: int) -> bool:
    """Do q rows H*D and k, v rows Hkv*D each (Hkv dividing H) make heads of one size D?"""
    head_dim = rows["q"] // num_heads
    if head_dim == 0 or rows["k"] != rows["v"] or rows["k"] % head_dim:
        return False
    kv_heads = rows["k"] // head_dim
    return kv_heads > 0 and num_heads % kv_heads == 0


def _shape(proj: Projection) -> tuple[int, int]:
    return proj.out_features, proj.in_features


def _attention_module_candidates(layers, seen) -> list[tuple]:
    """An inner nn.MultiheadAttention: its in-projection rows are q, k, v and its out_proj the output."""
    calls = [p for n, p in layers.items() if p.kind == "in_proj" and seen.get(n)]
    if not calls:
        return []
    mha = calls[0].layer
    pieces = {role: [(n, None)] for n, p in layers.items() if p.kind == "in_proj" and p.layer is mha
              for role in [ROLES[p.role]]}
    out = [n for n, p in layers.items() if p.layer is mha.out_proj]
    return [({**pieces, "o": [(out[0], None)]}, mha.num_heads, "torch-mha", {})]


def _shared_heads(layers, seen, widths: dict[str, int]) -> dict[str, Projection]:
    """Projections called on a whole input although they take a slice of it: one Linear shared by heads."""
    shared = dict(layers)
    for name, proj in layers.items():
        tags = set(seen.get(name, [])) - {"mid"}
        width = widths.get(next(iter(tags)), 0) if len(tags) == 1 and "mid" not in seen[name] else 0
        if proj.kind != "in_proj" and proj.in_features < width and width % proj.in_features == 0:
            shared[name] = shared_across_heads(proj, width)
    return shared


def candidate_roles(module: nn.Module, seen: dict[str, list[str]], self_attention: bool,
                    num_heads: int | None, widths: dict[str, int] | None = None) -> list[RoleAssignment]:
    """Every plausible role assignment, given what each projection saw (see ``ProjectionInputs``);
    ``widths``: tag -> the width of that input (to find a small Linear shared by all heads)."""
    layers = _shared_heads(linear_layers(module), seen, widths or {})
    inputs = [n for n in layers if seen.get(n) and "mid" not in seen[n]]
    mids = [n for n in layers if "mid" in seen.get(n, [])]
    unused = [n for n in layers if n not in seen]
    shared = {p.heads for p in layers.values() if p.heads > 1}

    def heads(inner: int) -> list[int]:
        if len(shared) == 1:  # a Linear shared by H heads fixes H
            return list(shared)
        if num_heads and inner % num_heads == 0:
            return [num_heads]
        return [h for h in _divisors(inner) if h > 1] + [1]  # one head last

    found = (_attention_module_candidates(layers, seen)
             or (_self_candidates(layers, inputs, unused, heads) if self_attention
                 else _qkv_candidates(layers, seen, unused, heads)))
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
        for out in outs:
            placed = {role: [(layers[n], r) for n, r in part] for role, part in {**pieces, "o": out}.items()}
            assignments.append(RoleAssignment(placed, h, style, labels))
    return assignments
