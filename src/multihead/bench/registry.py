"""Every implementation a suite can name: ours, the floor, torch's, and the textbook classes."""
from __future__ import annotations

from collections.abc import Callable

from multihead.bench.peers import PEERS, Runner, Shape
from multihead.bench.textbook_peers import TEXTBOOK_PEERS


def names() -> list[str]:
    """Every implementation name, ours first."""
    return [*PEERS, *TEXTBOOK_PEERS]


def build(name: str, shape: Shape) -> Runner:
    """Build the implementation called `name` for `shape`."""
    makers: dict[str, Callable[[Shape], Runner]] = {**PEERS, **TEXTBOOK_PEERS}
    if name not in makers:
        raise KeyError(f"unknown implementation {name!r}; known: {', '.join(makers)}")
    return makers[name](shape)
