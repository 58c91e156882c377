"""Checks that end the same way on every rank: bad input raises AttentionError everywhere, never a hang.

A rank that raised alone would leave the others waiting in the next collective until its timeout.
So each rank first checks its own input and sums it up in a row of ints (shapes, dtype, flags, a
mask fingerprint); one small all_gather gives every rank every row; then

    a rank whose own check failed raises its own error,
    every other rank raises an AttentionError naming the ranks that failed,
    and the checks across ranks (same heads, shard lengths of the agreed split, ...) run on the
    gathered rows, which are identical everywhere, so they pass or fail on every rank alike.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from multihead.errors import AttentionError
from multihead.parallel.comm import all_gather_ints

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def agree(group, describe: Callable[[], list[int]], width: int, who: str) -> list[list[int]]:
    """Every rank's row from `describe()` (width ints), after every rank checked its own input.

    describe raises AttentionError for bad local input; see the module docstring for what follows.
    """
    error = None
    try:
        row = [int(x) for x in describe()]
        if len(row) != width:
            raise RuntimeError(f"internal: {who} described its input with {len(row)} ints, expected {width}")
    except AttentionError as e:
        error, row = e, [0] * width
    table = all_gather_ints([0 if error is None else 1, *row], group)
    if error is not None:
        raise error
    failed = [r for r, got in enumerate(table) if got[0]]
    if failed:
        raise AttentionError(f"{who}: rank{'s' if len(failed) > 1 else ''} {', '.join(map(str, failed))} of "
                             f"{len(table)} rejected {'their' if len(failed) > 1 else 'its'} input (that rank's "
                             "error says why); every rank stops here rather than wait for it.")
    return [got[1:] for got in table]


def require_same(rows: Sequence[Sequence[int]], fields: dict[str, int], who: str, names=None) -> None:
    """AttentionError (on every rank) unless every rank has the same value in each of `fields`
    ({name: column}); `names` may map a column's ints back to readable values."""
    for name, column in fields.items():
        values = [row[column] for row in rows]
        if len(set(values)) > 1:
            shown = [names[name](v) for v in values] if names and name in names else values
            raise AttentionError(f"{who}: ranks disagree on {name}: {shown} in rank order; every rank must "
                                 f"pass the same {name}.")


def dtype_code(dtype: torch.dtype) -> int:
    return FLOAT_DTYPES.index(dtype) if dtype in FLOAT_DTYPES else len(FLOAT_DTYPES)


def dtype_name(code: int) -> str:
    return str(FLOAT_DTYPES[code]).replace("torch.", "") if code < len(FLOAT_DTYPES) else "other"
