"""`multihead bench [--suite NAME ...] [--quick] [--threads N] [--clock wall|cpu] [--plot DIR] [--json [PATH]]
[--markdown PATH]`.

Runs the chosen CPU suites (all by default) with progress bars on stderr, prints each suite's table
and the targets (as wide as the terminal, 100 columns when piped), and says so when the machine was
busy. Every number also goes into one JSON line: on stdout with `--json` (or `--json -`), into PATH
with `--json PATH`, else into DEFAULT_JSON, whose path is printed on stderr. Exit code 0 even when a
target is missed: the table says so.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from multihead.bench import machine, report
from multihead.bench.plots import save_all
from multihead.bench.progress import Bars
from multihead.bench.suites.context import Context
from multihead.bench.timing import set_clock, set_threads

QUICK_TIME = "about 1 to 2 minutes on an idle machine, all suites; longer on a busy one"
DEFAULT_JSON = Path(tempfile.gettempdir()) / "multihead-bench.json"   # where the JSON goes without --json

SUITES = ("shootout", "scaling", "padded", "roofline", "small", "decode", "parallel", "latent")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--suite", action="append", choices=SUITES, metavar="NAME",
                        help=f"run only this suite (repeatable): {', '.join(SUITES)}")
    parser.add_argument("--quick", action="store_true",
                        help=f"small sizes and 3 rounds ({QUICK_TIME}); the run prints how long it took")
    parser.add_argument("--plot", metavar="DIR", help="write one PNG per suite into DIR")
    parser.add_argument("--json", metavar="PATH", nargs="?", const="-",
                        help="every number as one JSON line: on stdout with --json or --json -, else into PATH "
                             f"(default without --json: {DEFAULT_JSON}, path printed on stderr)")
    parser.add_argument("--markdown", metavar="PATH", help="also write the tables as Markdown to PATH")
    parser.add_argument("--threads", type=int, help="torch intra-op threads (default: torch's choice)")
    parser.add_argument("--rounds", type=int, help="timed rounds per comparison (default 5, quick 3)")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="wall: elapsed time (default); cpu: this process's CPU time, steadier on a "
                             "busy machine (use with --threads 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    started = time.perf_counter()
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
    info = {**machine.describe(), "load_average_at_start": load_at_start,
            "seconds": round(time.perf_counter() - started, 1)}
    report.print_rich(results, info)
    line = report.json_line(results, info)
    if args.json == "-":
        print(line)
    else:
        path = Path(args.json or DEFAULT_JSON)
        path.write_text(line + "\n")
        print(f"multihead bench: every number, as one JSON line, is in {path}"
              + ("" if args.json else " (--json PATH to choose the file, --json alone for stdout)"), file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown(results))
    if args.plot:
        for path in save_all(results, args.plot):
            print(f"plot: {path}")
    print(f"multihead bench: took {info['seconds']:.0f} s" + (" (--quick)" if args.quick else ""), file=sys.stderr)
    return 0
