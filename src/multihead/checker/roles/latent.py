"""A learner's multi-head latent attention (MLA): which Linear is which, and MLA written out plainly.

Roles are found from the dataflow of one naive call (names are not trusted; ``projections.ProjectionInputs``
watches every linear map, nn.Linear or a Linear of the learner's own or a raw parameter, and the leaf layers
in between):

- the down-projection W_DKV reads x, and one or two Linears read its output (or its first C features),
  directly or through one leaf layer of the module (a norm on the latent, DeepSeek's kv_a_layernorm): the
  up-projections W_UK and W_UV (either order), or one Linear holding each head's [k_nope | v] rows
  (DeepSeek's kv_b_proj);
- the other Linears on x are the query W_Q (each head [q_nope | q_rope]) and the rotary key W_KR, unless
  W_DKV's output is wider than the latent (DeepSeek's kv_a_proj_with_mqa: [c | k_rope]);
- low-rank queries (DeepSeek's q_a_proj, q_a_layernorm, q_b_proj): an x-reader W_DQ whose output one Linear
  reads, directly or through one layer (the norm on the query latent): that reader W_UQ gives the queries;
- the rotary queries may come from a Linear of their own, W_QR (on x, or on the query latent as the
  DeepSeek-V2 paper writes it), next to the one giving the rest of each head's query;
- the Linear whose output is the module's output is W_O (none: the heads are returned concatenated).

``latent_variant(roles, x, rope, causal, absorbed=..., mistake=...)`` is MLA in plain torch on those
weights: the naive form (every head's keys and values decompressed) or the absorbed one (W_UK folded into
the query, attention over the latents, W_UV after the sum), with at most one known mistake.

Shapes: x (B, L, E); H heads, C latent width, Cq query latent width, Dn/R the two parts of a query/key head,
Dv value head.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from multihead.checker.roles.projections import Projection, ProjectionInputs

Piece = tuple[Projection, object]  # (a projection, rows: None = all, or an index tensor)
WUK_TRANSPOSED = "mla-absorbed-wuk-transposed"  # the absorbed form's mistake: q_nope @ W_UKᵀ per head


@dataclass
class LatentRoles:
    """Where each MLA weight lives in the learner's module, for one head count and one order."""

    q: Projection  # W_Q (H*(Dn+R), E), or W_UQ (H*(Dn+R), Cq) after ``q_down``: each head's [nope | rope] rows
    # (its nope rows only, H*Dn, when ``q_rope`` gives the rotary ones)
    down: Projection  # W_DKV: (C, E), or (C+R, E) with the rotary key in its last R rows
    rotary: Projection | None  # W_KR (R, E), or None when ``down`` holds it
    up_k: Piece  # W_UK rows (H*Dn, C), head-major
    up_v: Piece  # W_UV rows (H*Dv, C), head-major
    o: Projection | None
    num_heads: int
    nope: int  # Dn
    rope_dim: int  # R
    value_dim: int  # Dv
    latent: int  # C
    norm: tuple | None = None  # (name, the module's own layer applied to the latent), or None
    q_down: Projection | None = None  # W_DQ (Cq, E): low-rank queries, or None (one W_Q on x)
    q_norm: tuple | None = None  # (name, the module's own layer applied to the query latent), or None
    q_rope: Projection | None = None  # W_QR (H*R, E or Cq): the rotary queries apart; ``q`` then gives H*Dn

    def queries(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, E) -> every head's query (B, L, H*(Dn+R)), through the query latent when there is one."""
        B, L, _ = x.shape
        if self.q_down is not None:
            x = _linear(x, self.q_down)  # (B, L, Cq)
            x = x if self.q_norm is None else self.q_norm[1](x)
        if self.q_rope is None:
            return _linear(x, self.q)
        nope = _linear(x, self.q).view(B, L, self.num_heads, self.nope)
        rope = _linear(x, self.q_rope).view(B, L, self.num_heads, self.rope_dim)
        return torch.cat((nope, rope), dim=-1).flatten(2)

    def up_weights(self) -> tuple[tuple, tuple]:
        """((W_UK (H, Dn, C), its bias (H, Dn) or None), (W_UV (H, Dv, C), its bias (H, Dv) or None))."""
        H = self.num_heads
        found = []
        for (proj, rows), width in ((self.up_k, self.nope), (self.up_v, self.value_dim)):
            weight, bias = _rows(proj, rows)
            found.append((weight.view(H, width, self.latent), None if bias is None else bias.view(H, width)))
        return found[0], found[1]

    def describe(self) -> dict[str, str]:
        """Role -> where it lives, e.g. {"q": "W_Q", "latent": "W_DKV", "k": "W_UK", ...}."""
        def piece(p: Piece, part: str) -> str:
            viewed = f" rows viewed as (H={self.num_heads}, Dn + Dv, C)[:, {part}]"
            return p[0].name + ("" if p[1] is None else viewed)
        C, R = self.latent, self.rope_dim
        down = self.down.name + (f" rows 0:{C}" if self.rotary is None else "") + \
            (f", then {self.norm[0]}" if self.norm else "")
        rotary = self.rotary.name if self.rotary else f"{self.down.name} rows {C}:{C + R}"
        chain = [] if self.q_down is None else [self.q_down.name] + ([self.q_norm[0]] if self.q_norm else [])
        q = {"q": ", then ".join(chain + [self.q.name])}
        if self.q_rope is not None:
            q["rope-query"] = ", then ".join(chain + [self.q_rope.name])
        return {**q, "latent": down, "rope-key": rotary,
                "k": piece(self.up_k, f":{self.nope}"), "v": piece(self.up_v, f"{self.nope}:"),
                "o": self.o.name if self.o else "(none)"}


def _rows(proj: Projection, rows) -> tuple:
    weight, bias = proj.weight_bias()
    if rows is None:
        return weight, bias
    return weight[rows], None if bias is None else bias[rows]


def _row_count(piece: Piece) -> int:
    proj, rows = piece
    return proj.out_features if rows is None else len(rows)


def _linear(x: torch.Tensor, proj: Projection) -> torch.Tensor:
    return F.linear(x, *proj.weight_bias())


class _LeafCalls:
    """Context manager: the calls of every leaf layer (not a projection) made inside it, as
    ``made``: id(output) -> (its name, the tensor it was given), keeping both tensors."""

    def __init__(self, module, skip: set[int]):
        self.layers = {name: layer for name, layer in module.named_modules()
                       if name and not list(layer.children()) and id(layer) not in skip}
        self.made, self._outputs, self._handles = {}, {}, []

    def __enter__(self) -> _LeafCalls:
        for name, layer in self.layers.items():
            def hook(mod, inputs, output, name=name):
                if inputs and isinstance(inputs[0], torch.Tensor) and isinstance(output, torch.Tensor):
                    self.made[id(output)] = (name, inputs[0])
                    self._outputs.setdefault(name, (inputs[0], output))
            self._handles.append(layer.register_forward_hook(hook))
        return self

    def given_made(self) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Leaf layer -> (what its first call was given, what it gave)."""
        return self._outputs

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()


def _prefix(origin) -> bool:
    """Does a tensor of this origin hold the first rows of a map's output (all, or the first C), in order?"""
    if origin is None or origin.kind != "map":
        return False
    rows = torch.unique(origin.shadow)
    return torch.equal(rows, torch.arange(len(rows)))


def _through(found, leaves: _LeafCalls) -> tuple[str, torch.Tensor] | None:
    """(the leaf layer whose output ``found`` read, what that layer was given): by identity, else (the read
    was cut from a tensor the layer's output went into) by its values, as the layer's first features."""
    if id(found.read) in leaves.made:
        return leaves.made[id(found.read)]
    for name, (given, made) in leaves.given_made().items():
        if made.shape[:-1] == found.read.shape[:-1] and made.shape[-1] >= found.read.shape[-1] and \
                torch.equal(made[..., :found.read.shape[-1]], found.read):
            return name, given
    return None


def _chains(watched, leaves: _LeafCalls) -> dict[str, list[tuple[str, str | None]]]:
    """Map -> [(a map reading its output, or its first features, directly or through one leaf layer: that
    layer's name, else None)], by provenance (by values where a cat in between hides it)."""
    flow, names = watched.flow, watched.map_names
    readers: dict[str, list[tuple[str, str | None]]] = {}
    for index, found in enumerate(flow.maps):
        origin, through = found.reads, None
        layer = _through(found, leaves) if origin.kind == "derived" else None
        if layer is not None:  # a norm in between
            through, origin = layer[0], flow.origin(layer[1])
        if _prefix(origin):
            pair, source = (names[index], through), names[origin.source]
            if pair not in readers.get(source, []):
                readers.setdefault(source, []).append(pair)
    return readers


def find_latent_roles(module, projections: dict[str, Projection], call, x: torch.Tensor,
                      heads: int | None) -> list[LatentRoles]:
    """Every MLA role assignment that fits the dataflow of ``call(x)`` (the naive forward, batch first);
    [] for a module that is not MLA-shaped."""
    skip = {id(p.layer) for p in projections.values() if p.kind != "traced"}
    with torch.no_grad(), ProjectionInputs(module, {"x": x}, projections) as watched, \
            _LeafCalls(module, skip) as leaves:
        out = call(x)
    linears = {n: p for n, p in watched.projections.items() if p.kind in ("linear", "traced") and p.heads == 1}
    on_x = [n for n in linears if watched.seen.get(n, [None])[0] == "x"]
    readers = {source: read for source, read in _chains(watched, leaves).items() if source in on_x}
    made = watched.flow.origin(out)
    output = [watched.map_names[made.source]] if made is not None and made.kind == "map" else []
    found = []
    for down, read in readers.items():
        ups, norms = [name for name, _ in read], {layer for _, layer in read}
        if len(ups) > 2 or len(norms) != 1 or len({linears[u].in_features for u in ups}) != 1:
            continue
        C = linears[ups[0]].in_features
        fused = linears[down].out_features > C
        others = [n for n in on_x if n != down]
        o = linears[output[0]] if output and output[0] not in on_x + ups else None
        norm = next(iter(norms))
        found += _assignments(linears, down, ups, o, C, heads,
                              None if norm is None else (norm, leaves.layers[norm]),
                              _query_options(leaves.layers, readers, others, fused))
    return found


def _query_options(layers, readers, others: list[str], fused: bool) -> list[tuple]:
    """Every way the x-readers other than W_DKV fit the query's roles, as (W_Q or W_UQ, W_QR or None,
    W_KR or None, W_DQ or None, (the query latent's norm name, its layer) or None): W_KR exactly when the
    rotary key is not W_DKV's (``fused``); W_QR (the rotary queries, apart from the rest) optional; W_DQ
    when one x-reader's output is read by one or two Linears (W_UQ, and W_QR)."""
    q_downs = [n for n in others if n in readers]
    rotaries = 0 if fused else 1
    if not q_downs:
        if len(others) not in (1 + rotaries, 2 + rotaries):
            return []
        options = []
        for order in itertools.permutations(others):
            q, rest = order[0], list(order[1:])
            rotary = rest.pop() if rotaries else None
            options.append((q, rest[0] if rest else None, rotary, None, None))
        return options
    read, rest = readers[q_downs[0]], [n for n in others if n != q_downs[0]]
    norms = {layer for _, layer in read}
    if len(q_downs) > 1 or len(read) > 2 or len(norms) != 1 or len(rest) != rotaries:
        return []
    norm = next(iter(norms))
    norm = None if norm is None else (norm, layers[norm])
    names = [name for name, _ in read]
    return [(q, q_rope, rest[0] if rest else None, q_downs[0], norm)
            for q, q_rope in itertools.permutations(names + [None] * (2 - len(names)), 2)
            if q is not None and (q_rope is None) == (len(names) == 1)]


def _assignments(linears, down: str, ups: list[str], o, C: int, heads, norm,
                 queries: list[tuple]) -> list[LatentRoles]:
    """The assignments of one down-projection: every order of its readers, every way the query's roles fit
    (``_query_options``), every head count that makes the widths fit."""
    found = []
    for q_name, q_rope_name, rotary_name, q_down_name, q_norm in queries:
        q, rotary = linears[q_name], linears[rotary_name] if rotary_name else None
        q_rope, q_down = (linears[n] if n else None for n in (q_rope_name, q_down_name))
        R = rotary.out_features if rotary else linears[down].out_features - C
        if q_rope is not None:  # its width fixes the head count
            counts = [q_rope.out_features // R] if q_rope.out_features % R == 0 else []
        else:
            counts = [h for h in range(1, q.out_features + 1) if q.out_features % h == 0]
        for H in [h for h in counts if heads in (None, h)]:
            if q.out_features % H or (q_rope is None and q.out_features // H <= R):
                continue
            Dn = q.out_features // H - (0 if q_rope is not None else R)
            for up_k, up_v in _up_pieces(linears, ups, H, Dn):
                Dv = _row_count(up_v) // H
                if _row_count(up_k) != H * Dn or Dv == 0 or (o is not None and o.in_features != H * Dv):
                    continue
                found.append(LatentRoles(q, linears[down], rotary, up_k, up_v, o, H, Dn, R, Dv, C, norm,
                                         q_down, q_norm, q_rope))
    return found


def _up_pieces(linears, ups: list[str], H: int, Dn: int) -> list[tuple[Piece, Piece]]:
    """(W_UK, W_UV) pieces: two Linears in either order, or one holding each head's [k_nope | v] rows."""
    if len(ups) == 2:
        a, b = (linears[u] for u in ups)
        return [((a, None), (b, None)), ((b, None), (a, None))]
    fused = linears[ups[0]]
    if fused.out_features % H or fused.out_features // H <= Dn:
        return []
    rows = torch.arange(fused.out_features).view(H, fused.out_features // H)  # (H, Dn + Dv)
    return [((fused, rows[:, :Dn].reshape(-1)), (fused, rows[:, Dn:].reshape(-1)))]


def latent_variant(roles: LatentRoles, x: torch.Tensor, rope, causal: bool, *, absorbed: bool = False,
                   mistake: str | None = None, scale: float | None = None) -> torch.Tensor:
    """MLA on x (B, L, E) with the learner's weights -> (B, L, O): naive, or absorbed (``mistake`` =
    WUK_TRANSPOSED: the query multiplied by each head's W_UKᵀ, which runs only when Dn == C).
    ``rope``: a rotary.Rotary turning q_rope and the rotary key to positions 0 .. L-1, or None; ``scale``
    multiplies the scores (default 1/sqrt(Dn + R))."""
    B, L, _ = x.shape
    H, Dn, C = roles.num_heads, roles.nope, roles.latent
    q = roles.queries(x).view(B, L, H, Dn + roles.rope_dim).transpose(1, 2)  # (B, H, L, Dn + R)
    q_nope, q_rope = q[..., :Dn], q[..., Dn:]
    down = _linear(x, roles.down)  # (B, L, C) or (B, L, C + R)
    c = down[..., :C] if roles.norm is None else roles.norm[1](down[..., :C])  # the latent a decoder caches
    k_rope = (down[..., C:] if roles.rotary is None else _linear(x, roles.rotary))[:, None]  # (B, 1, L, R)
    if rope is not None:
        positions = torch.arange(L)
        q_rope, k_rope = rope.turn(q_rope, positions), rope.turn(k_rope, positions)
    (w_uk, b_uk), (w_uv, b_uv) = roles.up_weights()  # (H, Dn, C), (H, Dv, C)
    if absorbed:  # q_nope . (W_UK c + b) = (q_nope W_UK) . c + a constant per query, which the softmax drops
        folded = w_uk.transpose(-2, -1) if mistake == WUK_TRANSPOSED else w_uk
        scores = (q_nope @ folded) @ c[:, None].transpose(-2, -1)  # (B, H, L, C) @ (B, 1, C, L)
    else:
        k_nope = torch.einsum("blc,hdc->bhld", c, w_uk) + (0 if b_uk is None else b_uk[:, None])  # (B, H, L, Dn)
        scores = q_nope @ k_nope.transpose(-2, -1)
    scale = (Dn + roles.rope_dim) ** -0.5 if scale is None else scale
    scores = (scores + q_rope @ k_rope.transpose(-2, -1)) * scale  # (B, H, L, L)
    if causal:
        scores = scores.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
    weights = scores.softmax(dim=-1)
    if absorbed:  # W_UV after the weighted sum of latents
        out = (weights @ c[:, None]) @ w_uv.transpose(-2, -1)  # (B, H, L, C) @ (H, C, Dv)
    else:
        out = weights @ torch.einsum("blc,hdc->bhld", c, w_uv)  # (B, H, L, Dv)
    if b_uv is not None:
        out = out + b_uv[:, None]  # the weights sum to 1
    out = out.transpose(1, 2).reshape(B, L, H * roles.value_dim)
    return out if roles.o is None else _linear(out, roles.o)
