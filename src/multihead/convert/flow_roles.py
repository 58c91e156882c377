"""What a watched call (``dataflow.Flow``) says about attention: the pieces of each linear map's output, and
which piece is the query, the key, the value and which map the output projection.

Pieces. Every op that computes on a map's output uses some of its rows (``Use``). Uses that share rows, or
that end up side by side in one ``cat`` (RoPE's turned part next to the part it leaves), form one piece;
the rest stay apart. So a fused ``qkv`` split into q (H*D rows), k and v (Hkv*D rows each) gives three
pieces, whether it was cut by ``split``, ``chunk``, slices or a per-head view with ``unbind``; a Linear
whose output is used whole gives one.

A piece used as two parts of every head ([0:a] and [a:D] of each head's D features, with nothing reading
them together before the cat) has ``split`` a: partial rotary (RoPE turns the first a features) or MLA's
[nope | rope] query.

Roles. The attention maths names them: ``scaled_dot_product_attention(q, k, v)``, or a product of two
pieces' descendants (the scores: queries first) whose result, through a softmax, multiplies a third (the
values). The output projection is the last map reading what came out of that product.

``watch(module, call, inputs)`` runs one call under the flow and gives all of it (``Watched``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from multihead.convert.dataflow import Flow, Records


@dataclass(eq=False)
class Piece:
    """Rows of one map's output used together: ``rows`` (n,) sorted; ``split`` see the module docstring."""

    map: int
    rows: torch.Tensor
    uses: list[int]
    split: int | None = None


class _Groups:
    """Union-find over use ids."""

    def __init__(self, count: int):
        self.parent = list(range(count))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def join(self, a: int, b: int) -> None:
        self.parent[self.find(a)] = self.find(b)


def map_pieces(records: Records) -> dict[int, list[Piece]]:
    """Map index -> its pieces, ordered by their first row (maps whose output nothing computed on: none)."""
    uses = records.uses
    groups = _Groups(len(uses))
    by_map: dict[int, list[int]] = {}
    for i, use in enumerate(uses):
        by_map.setdefault(use.map, []).append(i)
    for ids in by_map.values():
        for n, a in enumerate(ids):
            for b in ids[n + 1:]:
                if torch.isin(uses[a].rows, uses[b].rows).any():
                    groups.join(a, b)
    for a, b in records.joins:
        if uses[a].map == uses[b].map:
            groups.join(a, b)
    found: dict[int, list[Piece]] = {}
    for index, ids in by_map.items():
        members: dict[int, list[int]] = {}
        for i in ids:
            members.setdefault(groups.find(i), []).append(i)
        pieces = [_piece(index, [uses[i] for i in group], group) for group in members.values()]
        found[index] = sorted(pieces, key=lambda p: int(p.rows[0]))
    return found


def _piece(index: int, uses, ids: list[int]) -> Piece:
    rows = torch.unique(torch.cat([u.rows for u in uses]))
    widest = [u for u in uses if not any(u is not o and bool(torch.isin(u.rows, o.rows).all())
                                         and len(o.rows) > len(u.rows) for o in uses)]
    distinct = {tuple(u.rows.tolist()): u for u in widest}
    return Piece(index, rows, ids, _split(rows, list(distinct.values())))


def _split(rows: torch.Tensor, widest) -> int | None:
    """a when the two widest uses are [0:a] and [a:D] of every head (D = a + b), else None."""
    if len(widest) != 2 or torch.isin(widest[0].rows, widest[1].rows).any():
        return None
    for first, second in (widest, widest[::-1]):
        a, D = first.width, first.width + second.width
        if len(rows) % D:
            continue
        position = torch.searchsorted(rows, first.rows)
        if len(first.rows) * D == len(rows) * a and bool((position % D < a).all()):
            return a
    return None


@dataclass
class FlowRoles:
    """The pieces attention's maths names: q, k, v (each a list of pieces, one per map), and the output map."""

    q: list[Piece]
    k: list[Piece]
    v: list[Piece]
    out: int | None  # the index of the output projection's map, or None (heads concatenated)


def _nearest(ancestry: frozenset | None, records: Records, by_use: dict[int, Piece]) -> list[Piece]:
    """The pieces an operand comes from, nearest first: maps feeding other maps in the set are dropped."""
    if not ancestry:
        return []
    pieces = {id(by_use[u]): by_use[u] for kind, u in ancestry if kind == "use" and u in by_use}
    maps = {p.map for p in pieces.values()}
    upstream = {m for m in maps for other in maps
                if other != m and ("map", m) in records.maps[other].reads.ancestry}
    return [p for p in pieces.values() if p.map not in upstream]


def name_roles(records: Records, pieces: dict[int, list[Piece]]) -> FlowRoles | None:
    """q, k, v and the output map named by the attention maths (module docstring), or None."""
    by_use = {u: p for found in pieces.values() for p in found for u in p.uses}
    for index, c in enumerate(records.contractions):
        operands = [_nearest(a, records, by_use) for a in c.operands]
        if c.op == "scaled_dot_product_attention" and len(operands) >= 3 and all(operands[:3]):
            return FlowRoles(*operands[:3], _output_map(records, index))
    for index, scores in enumerate(records.contractions):
        operands = [_nearest(a, records, by_use) for a in scores.operands]
        if len(operands) != 2 or not all(operands) or _overlap(*operands):
            continue
        for after, values in enumerate(records.contractions[index + 1:], index + 1):
            if len(values.operands) != 2:
                continue
            for weights, value in (values.operands, values.operands[::-1]):
                found = _nearest(value, records, by_use)
                if weights and ("contraction", index) in weights and found and \
                        ("contraction", index) not in (value or ()) and not _overlap(found, operands[0] + operands[1]):
                    q, k = _query_first(scores, operands)
                    return FlowRoles(q, k, found, _output_map(records, after))
    return None


def _overlap(a: list[Piece], b: list[Piece]) -> bool:
    return any(x is y for x in a for y in b)


def _query_first(scores, operands) -> tuple[list[Piece], list[Piece]]:
    """(queries, keys) of the scores product: its first operand, unless an einsum's output says otherwise
    (the operand holding the output's second-to-last index gives the rows: the queries)."""
    if scores.equation and "->" in scores.equation:
        terms, out = scores.equation.replace(" ", "").split("->")
        first, second = terms.split(",")[:2]
        if len(out) >= 2 and out[-2] in second and out[-2] not in first:
            return operands[1], operands[0]
    return operands[0], operands[1]


def _output_map(records: Records, contraction: int) -> int | None:
    """The last map that reads (a descendant of) the contraction's result."""
    found = [i for i, m in enumerate(records.maps) if ("contraction", contraction) in m.reads.ancestry]
    return found[-1] if found else None


@dataclass
class Watched:
    """One watched call: the flow (maps, origins), each map's pieces, the roles the maths names (or None)
    and what the call returned."""

    flow: Flow
    pieces: dict[int, list[Piece]]
    roles: FlowRoles | None
    output: object

    def map_of(self, weight: torch.Tensor) -> int | None:
        """The first map applying all of ``weight`` (a Linear's, in its own (out, in) layout), or None."""
        natural = torch.arange(weight.numel()).view(weight.shape)
        return next((i for i, m in enumerate(self.flow.maps)
                     if m.weight.parameter is weight and torch.equal(m.weight.index, natural)), None)


def watch(module: nn.Module, call, inputs: dict[str, torch.Tensor]) -> Watched:
    """Run ``call()`` (which calls ``module`` on the tagged ``inputs``) without grad, watching its dataflow."""
    with torch.no_grad(), Flow(module, inputs) as flow:
        output = call()
    pieces = map_pieces(flow.records)
    return Watched(flow, pieces, name_roles(flow.records, pieces), output)
