"""The role assignments to try, from what each projection read during one call (``roles.candidate_roles``
puts them together and keeps the ones whose widths make heads).

Each generator returns tuples (pieces, heads, style, labels): pieces maps "q"/"k"/"v" (and "o" when known)
to [(projection name, rows)], rows None (all), a slice or an index tensor.

- stacked heads: three Linears per head index, in some order;
- one projection on x: the pieces its output was used in (``cuts``: a fused qkv split evenly or not, per
  head or not, as the dataflow saw it), else its thirds in every order or rows laid out per head (H, 3, D);
- a query projection and a fused key/value projection: its two pieces, or its halves, in either order;
- three separate projections in every order (one defined but never called counts);
- query, key and value given apart: the projection reading each; an inner nn.MultiheadAttention.
"""

from __future__ import annotations

import itertools
import re

import torch

from multihead.checker.roles.projections import Projection, shared_across_heads
from multihead.convert.flow_roles import Piece as FlowPiece

ROLES = ("q", "k", "v")
Piece = tuple[str, object]  # (a projection's name, rows: None = all, a slice, or an index tensor)


def observed_cuts(layers: dict[str, Projection], pieces: dict[str, list[FlowPiece]]) -> dict[str, list[tuple]]:
    """Name -> [(rows, label)]: the pieces a projection's output was used in, for projections cut in two or
    more (rows a slice when contiguous, else an index tensor with a label saying where they are)."""
    cuts = {}
    for name, found in pieces.items():
        if name in layers and layers[name].heads == 1 and len(found) >= 2:
            cuts[name] = [_rows_of(name, piece.rows, layers[name].out_features) for piece in found]
    return cuts


def _rows_of(name: str, rows: torch.Tensor, out: int) -> tuple:
    start, stop = int(rows[0]), int(rows[-1]) + 1
    if stop - start == len(rows):
        return slice(start, stop), ""
    for h in range(1, out + 1):  # rows laid out per head: (H, parts, D)[:, i]
        if out % h or (out // h) % (len(rows) // h if len(rows) % h == 0 else out + 1):
            continue
        width = len(rows) // h
        layout = torch.arange(out).view(h, out // (h * width), width)
        for i in range(layout.shape[1]):
            if torch.equal(layout[:, i].reshape(-1), rows):
                return rows, f"{name} rows viewed as (H={h}, {layout.shape[1]}, D)[:, {i}]"
    return rows, f"{name}: {len(rows)} rows from {start} to {stop - 1}"


def _key(candidate: tuple) -> tuple:
    """What makes two candidates the same: each role's rows, and the head count."""
    pieces, heads = candidate[0], candidate[1]
    def rows(r):
        return None if r is None else (r.start, r.stop) if isinstance(r, slice) else tuple(r.tolist())
    return tuple((role, tuple((n, rows(r)) for n, r in pieces[role])) for role in ROLES) + (heads,)


def _with_cuts(found: list[tuple], cut: list[tuple]) -> list[tuple]:
    """``found``, then the candidates from observed pieces that ``found`` does not already hold."""
    known = {_key(c) for c in found}
    return found + [c for c in cut if _key(c) not in known]


def _cut_candidates(name: str, cuts, heads) -> list[tuple]:
    """Three observed pieces of one projection as q, k, v in every order."""
    parts = cuts.get(name, [])
    if len(parts) != 3:
        return []
    labels = {i: label for i, (_, label) in enumerate(parts) if label}
    found = []
    for order in itertools.permutations(range(3)):
        pieces = {role: [(name, parts[i][0])] for role, i in zip(ROLES, order)}
        described = {role: labels[i] for role, i in zip(ROLES, order) if i in labels}
        found += [(pieces, h, "fused", described) for h in heads(_count(parts[order[0]][0]))]
    return found


def _cut_kv(q_name: str, kv_name: str, cuts, heads, inner: int) -> list[tuple]:
    """A query projection and two observed pieces of another as keys and values (either order)."""
    parts = cuts.get(kv_name, [])
    if len(parts) != 2:
        return []
    found = []
    for i in (0, 1):
        (k_rows, k_label), (v_rows, v_label) = parts[i], parts[1 - i]
        labels = {role: label for role, label in (("k", k_label), ("v", v_label)) if label}
        found += [({"q": [(q_name, None)], "k": [(kv_name, k_rows)], "v": [(kv_name, v_rows)]}, h, "fused-kv",
                   labels) for h in heads(inner)]
    return found


def _count(rows) -> int:
    return rows.stop - rows.start if isinstance(rows, slice) else len(rows)


def _head_index(name: str) -> int | None:
    """The first integer path component ("heads.2.W_query" -> 2, "to_q.1" -> 1), or None."""
    found = re.search(r"(?:^|\.)(\d+)(?:\.|$)", name)
    return int(found.group(1)) if found else None


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


def self_candidates(layers, inputs, unused, heads, cuts=None) -> list[tuple]:
    """Role candidates when one tensor x feeds every projection (``cuts``: see ``observed_cuts``)."""
    cuts = cuts or {}
    groups = _per_head_groups(inputs)
    if groups:  # stacked heads: head h owns groups[h], three Linears in some order
        three = [[(group[i], None) for group in groups] for i in range(3)]
        return _permuted(three, "per-head", lambda _: [len(groups)])
    if len(inputs) == 1:
        return _with_cuts(_fused(layers, inputs[0], heads), _cut_candidates(inputs[0], cuts, heads))
    if len(inputs) == 2:
        q_name, kv_name = sorted(inputs, key=lambda n: (len(cuts.get(n, [])) == 2, layers[n].out_features))
        found = _with_cuts(_fused_kv(layers, q_name, kv_name, heads),
                           _cut_kv(q_name, kv_name, cuts, heads, layers[q_name].out_features))
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


def qkv_candidates(layers, seen, unused, heads, cuts=None) -> list[tuple]:
    """Role candidates when query, key and value come in as separate tensors (``cuts``: ``observed_cuts``)."""
    cuts = cuts or {}
    by_role = {role: [n for n in layers if role in seen.get(n, [])] for role in ROLES}
    if not by_role["v"] and len(by_role["q"]) == 1:  # forward(x, context): keys = values
        q_name, on_context = by_role["q"][0], by_role["k"]
        if len(on_context) == 1:  # one fused to_kv
            found = _with_cuts(_fused_kv(layers, q_name, on_context[0], heads),
                               _cut_kv(q_name, on_context[0], cuts, heads, layers[q_name].out_features))
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


def attention_module_candidates(layers, seen) -> list[tuple]:
    """An inner nn.MultiheadAttention: its in-projection rows are q, k, v and its out_proj the output."""
    calls = [p for n, p in layers.items() if p.kind == "in_proj" and seen.get(n)]
    if not calls:
        return []
    mha = calls[0].layer
    pieces = {role: [(n, None)] for n, p in layers.items() if p.kind == "in_proj" and p.layer is mha
              for role in [ROLES[p.role]]}
    out = [n for n, p in layers.items() if p.layer is mha.out_proj]
    return [({**pieces, "o": [(out[0], None)]}, mha.num_heads, "torch-mha", {})]


def shared_heads(layers, seen, widths: dict[str, int]) -> dict[str, Projection]:
    """Projections called on a whole input although they take a slice of it: one Linear shared by heads."""
    shared = dict(layers)
    for name, proj in layers.items():
        tags = set(seen.get(name, [])) - {"mid"}
        width = widths.get(next(iter(tags)), 0) if len(tags) == 1 and "mid" not in seen[name] else 0
        if proj.kind != "in_proj" and proj.in_features < width and width % proj.in_features == 0:
            shared[name] = shared_across_heads(proj, width)
    return shared


def _shape(proj: Projection) -> tuple[int, int]:
    return proj.out_features, proj.in_features
