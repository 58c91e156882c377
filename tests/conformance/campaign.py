"""A random conformance campaign: thousands of random calls against the float64 reference.

    PYTHONPATH=src python -m tests.conformance.campaign --configs 10000 [--long 200] [--start 0] [--max-len 20]

Short slice: each configuration is one random Case (shapes up to --max-len, dtype, mask parts, softcap,
sinks), in one mode (grad, no_grad, inference_mode), run on every backend (flex on every 50th: eager
flex is slow). Long slice (--long N): N configurations over at least 2048 keys for each of varlen, banded,
decode and flex, each drawn so that its backend takes it (long_cases.py) and run by name. Prints every
failure (the seed rebuilds the case: make_case / make_long_case with random.Random(seed)), how many
configurations each backend really ran, and a summary; exits 1 when a failure is not explained by a known
defect (known.py), or when a long-slice backend refused a call drawn for it. Default sizes: the
MULTIHEAD_CAMPAIGN environment variable (short configurations; the long slice gets a fiftieth, at least 2).
test_conformance_campaign.py runs a CI-sized version.
"""
from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import time
import warnings

import torch

from tests.conformance.cases import make_case
from tests.conformance.check import BACKENDS, MODES, check_case
from tests.conformance.known import known_defect
from tests.conformance.long_cases import LONG_BACKENDS, make_long_case

FLEX_EVERY = 50  # eager flex costs about 0.5 s a call (it builds a BlockMask): every 50th configuration
LONG_SEED = 1_000_000  # the long slice's seeds start here (apart from the short slice's)


def sizes() -> tuple[int, int]:
    """(short configurations, long configurations per backend) from MULTIHEAD_CAMPAIGN (default 10000)."""
    short = int(os.environ.get("MULTIHEAD_CAMPAIGN", "10000"))
    return short, max(2, short // 50)


def main(argv=None) -> int:
    short, long = sizes()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=short)
    parser.add_argument("--long", type=int, default=long, help="long-slice configurations per backend")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--include-known", action="store_true",
                        help="also count failures that known.py attributes to a known defect")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # small tensors: threads only contend
    counts, by_known, ran = collections.Counter(), collections.Counter(), collections.Counter()
    started = time.perf_counter()

    def record(seed, case, mode, outcomes, slice_name):
        for outcome in outcomes:
            counts[outcome.status] += 1
            ran[(slice_name, outcome.backend)] += outcome.status == "ok"
            if outcome.status == "skip" and slice_name == "long":
                counts["unexplained"] += 1  # drawn for this backend: a refusal is a finding
                print(f"REFUSED seed={seed} mode={mode} backend={outcome.backend}: {outcome.message}\n    {case}")
            if outcome.status != "fail":
                continue
            known = known_defect(case, outcome.backend, mode, outcome.message)
            if known and not args.include_known:
                by_known[known] += 1
                continue
            counts["unexplained"] += 1
            print(f"FAIL {slice_name} seed={seed} mode={mode} backend={outcome.backend}: {outcome.message}\n    {case}")

    for seed in range(args.start, args.start + args.configs):
        case = make_case(random.Random(seed), max_len=args.max_len)
        mode = MODES[seed % len(MODES)]
        backends = BACKENDS if seed % FLEX_EVERY == 0 else tuple(b for b in BACKENDS if b != "flex")
        record(seed, case, mode, check_case(case, mode, backends), "short")
    for i in range(args.long):
        for backend in LONG_BACKENDS:
            seed = LONG_SEED + args.start + i * len(LONG_BACKENDS) + LONG_BACKENDS.index(backend)
            case, mode = make_long_case(random.Random(seed), backend)
            record(seed, case, mode, check_case(case, mode, (backend,)), "long")
    took = time.perf_counter() - started
    print(f"\n{args.configs} short configurations and {args.long} long ones per backend (>= 2048 keys), "
          f"{sum(counts[s] for s in ('ok', 'skip', 'fail'))} backend runs in {took:.0f} s: {counts['ok']} ok, "
          f"{counts['skip']} refused by the backend, {counts['fail']} failed ({counts['unexplained']} unexplained)")
    for slice_name in ("short", "long"):
        runs = ", ".join(f"{b} {n}" for (s, b), n in sorted(ran.items()) if s == slice_name)
        print(f"  configurations each backend ran, {slice_name} slice: {runs}")
    for known, n in sorted(by_known.items()):
        print(f"  {n} failures from a known defect: {known}")
    return 1 if counts["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(main())
