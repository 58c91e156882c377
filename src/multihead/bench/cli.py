"""`multihead bench [--suite NAME ...] [--quick] [--threads N] [--clock wall|cpu] [--plot DIR] [--json PATH] [--markdown PATH]`.

Runs the chosen CPU suites (all by default) with progress bars on stderr, prints each suite's table
and the targets, then one JSON line with every number on stdout. Exit code 0 even when a target is
missed: the table says so.
"""
from __future__ import annotations

import argparse
import importlib
from dataclasses import replace
from pathlib import Path

SUITES = ("shootout", "scaling", "padded", "roofline", "small", "decode", "parallel", "latent")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", action="append", choices=SUITES, metavar="NAME",
                        help=f"run only this suite (repeatable): {', '.join(SUITES)}")
    parser.add_argument("--quick", action="store_true", help="small sizes and 3 rounds (~30 s)")
    parser.add_argument("--plot", metavar="DIR", help="write one PNG per suite into DIR")
    parser.add_argument("--json", metavar="PATH", help="also write the JSON line to PATH")
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown to PATH")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--rounds", type=int, help="timed rounds per comparison (default 5, quick 3)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: elapsed time (default); cpu: this process's CPU time, steadier on a "
                             "busy machine (use with --threads 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from multihead.bench import machine, report
    from multihead.bench.progress import Bars
    from multihead.bench.suites.context import Context
    from multihead.bench.timing import set_clock, set_threads

    set_threads(args.threads)
    set_clock(args.clock)
    rounds = args.rounds or (3 if args.quick else 5)
    ctx_kwargs = {"rounds": rounds, "budget_s": 10.0 if args.quick else 60.0}
    results = []
    load_at_start = machine.load_average()
    with Bars(enabled=not args.no_progress) as bars:
        ctx = Context(bars=bars, **ctx_kwargs)
        for name in args.suite or SUITES:
            suite = importlib.import_module(f"multihead.bench.suites.{name}")
            sizes = suite.Sizes.quick() if args.quick else suite.Sizes.full()
            results.append(suite.run(ctx, sizes))
    if args.quick:  # the targets are defined at the full sizes
        for r in results:
            r.targets = [replace(t, note=("quick sizes, indicative only; " + t.note).rstrip("; "))
                         for t in r.targets]
    info = {**machine.describe(), "load_average_at_start": load_at_start}
    report.print_rich(results, info)
    line = report.json_line(results, info)
    print(line)
    if args.json:
        Path(args.json).write_text(line + "\n")
    if args.markdown:
        Path(args.markdown).write_text(report.markdown(results))
    if args.plot:
        from multihead.bench.plots import save_all

        for path in save_all(results, args.plot):
            print(f"plot: {path}")
    return 0
