"""A random conformance campaign: thousands of random calls against the float64 reference.

    PYTHONPATH=src python -m tests.conformance.campaign --configs 10000 [--start 0] [--max-len 20]

Each configuration is one random Case (shapes, dtype, mask parts, softcap, sinks), in one mode (grad,
no_grad, inference_mode), run on every backend (flex on every 50th: eager flex is slow). Prints every
failure (the seed rebuilds the case: make_case(random.Random(seed))) and a summary; exits 1 when a
failure is not explained by a known defect (known.py). Not part of the test
suite's default run (test_conformance_properties.py runs a small version).
"""
from __future__ import annotations

import argparse
import collections
import random
import sys
import time
import warnings

from tests.conformance.cases import make_case
import torch

from tests.conformance.check import BACKENDS, MODES, check_case
from tests.conformance.known import known_defect

FLEX_EVERY = 50  # eager flex costs about 0.5 s a call (it builds a BlockMask): every 50th configuration


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=10_000)
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--max-len", type=int, default=20)
    parser.add_argument("--include-known", action="store_true",
                        help="also count failures that known.py attributes to a known defect")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)  # tiny tensors: threads only contend
    counts = collections.Counter()
    by_known = collections.Counter()
    started = time.perf_counter()
    for seed in range(args.start, args.start + args.configs):
        rng = random.Random(seed)
        case = make_case(rng, max_len=args.max_len)
        mode = MODES[seed % len(MODES)]
        backends = BACKENDS if seed % FLEX_EVERY == 0 else tuple(b for b in BACKENDS if b != "flex")
        for outcome in check_case(case, mode, backends):
            counts[outcome.status] += 1
            if outcome.status != "fail":
                continue
            known = known_defect(case, outcome.backend, mode, outcome.message)
            if known and not args.include_known:
                by_known[known] += 1
                continue
            counts["unexplained"] += 1
            print(f"FAIL seed={seed} mode={mode} backend={outcome.backend}: {outcome.message}\n    {case}")
    took = time.perf_counter() - started
    print(f"\n{args.configs} configurations, {sum(counts[s] for s in ('ok', 'skip', 'fail'))} backend runs in "
          f"{took:.0f} s: {counts['ok']} ok, {counts['skip']} refused by the backend, {counts['fail']} failed "
          f"({counts['unexplained']} unexplained)")
    for known, n in sorted(by_known.items()):
        print(f"  {n} failures from a known defect: {known}")
    return 1 if counts["unexplained"] else 0


if __name__ == "__main__":
    sys.exit(main())
