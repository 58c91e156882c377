"""What every suite receives: the progress bars and how hard to try."""
from __future__ import annotations

from dataclasses import dataclass, field

from multihead.bench.progress import Bars


@dataclass
class Context:
    """rounds: timed rounds per comparison; budget_s: seconds one comparison should take at most."""

    bars: Bars = field(default_factory=lambda: Bars(enabled=False))
    rounds: int = 5
    warmup: int = 1
    budget_s: float = 30.0
