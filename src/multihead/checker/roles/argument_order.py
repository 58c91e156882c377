"""Which tensor argument is the query, which the keys, which the values: found by behaviour.

``forward(values, keys, query, mask)`` (a popular video tutorial) and ``forward(v, k, q, mask)`` (ports of
the TensorFlow tutorial) exist next to ``forward(query, key, value)``, so the order is measured:

* the query: change token 0 of one argument only; for the query argument just output row 0 moves
  (every other row still reads the same query), while a change to a key or a value moves every row;
* the values: the output is an affine function of the values (weights @ V, then a Linear), but not of
  the keys (they pass through the softmax): f(a) + f(b) - f(0) = f(a + b) holds only for the values.

When a test cannot decide (a bug that mixes the rows, say), the names decide (``q``, ``query``...), and
the signature's own order is the last resort.
"""

from __future__ import annotations

import torch

from multihead.checker.loading.calling import INPUT_COUNT, CallSpec, invoke
from multihead.checker.compare import agree
from multihead.checker.behaviour.layout import bumped
from multihead.checker.loading.probes import PROBE_BATCH, inputs

_NAME_ROLES = (("query", "queries", "q", "x", "hidden_states", "hidden_state", "tgt", "target", "decoder"),
               ("key", "keys", "k", "context", "memory", "kv", "xa", "encoder_hidden_states", "src", "source"),
               ("value", "values", "v"))


def order_by_names(args: list[str]) -> tuple[int, ...] | None:
    """The roles the argument names announce (``(values, keys, query)`` -> (2, 1, 0)), or None."""
    count, roles = len(args), []
    for name in args:
        roles.append(next((r for r, names in enumerate(_NAME_ROLES) if name.lower() in names), None))
    if count == 2 and roles[0] in (1, 2) and roles[1] == 0:
        return (1, 0)  # forward(context, x)
    if count == 3 and sorted(r for r in roles if r is not None) == [0, 1, 2]:
        return tuple(roles)
    return None


def find_order(module, spec: CallSpec, dims, dtype, tol: float) -> tuple[tuple[int, ...] | None, bool]:
    """(order, by behaviour): the role of each tensor argument (0 query, 1 key, 2 value), and whether
    behaviour decided it (False: names or the signature's order). Raises LearnerError if a call fails."""
    count = INPUT_COUNT[spec.inputs]
    named = order_by_names(spec.args)
    if count == 1 or len(set(dims[:count])) > 1:  # different widths: the size arguments fixed the order
        return named, False
    raw = CallSpec(**{**spec.__dict__, "order": tuple(range(count))})
    xs = list(inputs((dims[0],) * 3, PROBE_BATCH, 5, 5, dtype, 20))[:count]
    base = invoke(module, raw, *xs)
    own_row_only = []
    for p in range(count):
        moved = invoke(module, raw, *[bumped([t], (slice(None), 0))[0] if i == p else t for i, t in enumerate(xs)])
        own_row_only.append(agree(base[:, 1:], moved[:, 1:], tol) and not agree(base[:, :1], moved[:, :1], tol))
    if own_row_only.count(True) != 1:
        return named, False
    query = own_row_only.index(True)
    rest = [p for p in range(count) if p != query]
    if count == 2:
        order = [1, 1]
        order[query] = 0
        return tuple(order), True
    affine = [_affine_in(module, raw, xs, p, tol) for p in rest]
    if affine.count(True) != 1:
        return named, False
    value = rest[affine.index(True)]
    order = [1, 1, 1]
    order[query], order[value] = 0, 2
    return tuple(order), True


def _affine_in(module, raw: CallSpec, xs: list, position: int, tol: float) -> bool:
    """Is the output an affine function of the argument at ``position``? f(a) + f(b) - f(0) == f(a + b)."""
    gen = torch.Generator().manual_seed(21)
    a, b = (torch.randn(xs[position].shape, generator=gen).to(xs[position].dtype) for _ in range(2))

    def at(t):
        return invoke(module, raw, *[t if i == position else x for i, x in enumerate(xs)])

    return agree(at(a) + at(b) - at(torch.zeros_like(a)), at(a + b), tol * 10)
