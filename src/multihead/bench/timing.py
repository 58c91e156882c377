"""Timing: warm up, then interleaved rounds and medians.

Every implementation in a comparison is timed once per round, round after round, so a burst of load
from elsewhere hits all of them alike and the ratios of medians stay meaningful on a shared machine.
Each round starts one implementation later than the one before, so that none of them always runs
first (after the previous round's last one has left the caches and the allocator in its own state).
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    """Seconds per call: the median over rounds, and every sample."""

    median_s: float
    samples: tuple[float, ...]

    @property
    def spread(self) -> float:
        """(max - min) / median: how noisy the samples were."""
        return (max(self.samples) - min(self.samples)) / self.median_s if self.median_s else 0.0


# "wall": elapsed seconds. "cpu": CPU seconds of this process (all its threads), which time spent
# waiting for a core on a busy machine does not inflate; honest for one thread, where no thread
# spins at a barrier waiting for another.
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}
_clock = ["wall"]


def clock_name() -> str:
    """The clock in use: "wall" or "cpu"."""
    return _clock[0]


def set_clock(name: str) -> str:
    """Time every later call with the clock `name` ("wall" or "cpu"); returns it."""
    if name not in CLOCKS:
        raise ValueError(f"clock must be one of {sorted(CLOCKS)}; got {name!r}")
    _clock[0] = name
    return name


def clock() -> str:
    """The clock in use: "wall" or "cpu"."""
    return _clock[0]


def time_call(fn: Callable[[], object]) -> float:
    """Seconds for one call of `fn`, on the clock in use."""
    now = CLOCKS[_clock[0]]
    start = now()
    fn()
    return now() - start


def compare(
    fns: Mapping[str, Callable[[], object]],
    *,
    rounds: int = 5,
    warmup: int = 1,
    budget_s: float | None = None,
    on_round: Callable[[], None] | None = None,
    after: Mapping[str, Callable[[], object]] | None = None,
) -> dict[str, Timing]:
    """Time each of `fns` once per round, interleaved, the order rotated by one each round; {name: Timing}.

    `warmup` untimed calls each come first. after[name], where given, is called untimed right after
    each timed call of `name` (a call that disturbs the next one, e.g. a large read, then disturbs none). With `budget_s`, fewer rounds are taken when the first
    round shows that `rounds` of them would run past it (never fewer than 3 rounds).
    """
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    planned = rounds
    for r in range(rounds):
        if r >= planned:
            break
        names = list(fns)
        for name in names[r % len(names):] + names[:r % len(names)]:
            samples[name].append(time_call(fns[name]))
            if after and name in after:
                after[name]()
        if r == 0 and budget_s is not None:
            per_round = sum(s[0] for s in samples.values())
            planned = max(3, min(rounds, int(budget_s / max(per_round, 1e-9))))
        if on_round is not None:
            on_round()
    return {name: Timing(statistics.median(s), tuple(s)) for name, s in samples.items()}


def ratio(a: Timing, b: Timing) -> float:
    """a / b as the median of the per-round ratios (rounds run under the same load, so a burst that
    slows one round slows both sides); the ratio of medians when the rounds do not pair up."""
    if len(a.samples) != len(b.samples):
        return a.median_s / b.median_s
    return statistics.median(x / y for x, y in zip(a.samples, b.samples))


def ratio_range(a: Timing, b: Timing) -> tuple[float, float]:
    """(lowest, highest) per-round ratio a / b: how far the rounds spread around `ratio(a, b)`."""
    if len(a.samples) != len(b.samples):
        return (min(a.samples) / max(b.samples), max(a.samples) / min(b.samples))
    per_round = [x / y for x, y in zip(a.samples, b.samples)]
    return min(per_round), max(per_round)


def set_threads(n: int | None) -> int:
    """Use `n` intra-op threads (None: leave torch's choice); returns the count in effect."""
    if n is not None:
        torch.set_num_threads(n)
    return torch.get_num_threads()
