"""`multihead bench [--suite NAME ...] [--quick] [--threads N] [--clock wall|cpu] [--plot DIR] [--json [PATH]]
[--markdown PATH]`.

Runs the chosen CPU suites (all by default) with progress bars on stderr, prints each suite's table
and the targets (as wide as the terminal, 100 columns when piped), and says so when the machine was
busy. Every number also goes into one JSON line, when asked: on stdout with `--json` (or `--json -`),
into PATH with `--json PATH`. Nothing is written unasked. Exit code 0 even when a target is missed: the
table says so.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from dataclasses import replace
from pathlib import Path

from multihead.bench import machine, report
from multihead.bench.plots import save_all
from multihead.bench.progress import Bars
from multihead.bench.suites.context import Context
from multihead.bench.timing import set_clock, set_threads
from multihead.terminal.help import help_texts

QUICK_TIME = "about 1 to 2 minutes on an idle machine, all suites; longer on a busy one"

SUITES = ("shootout", "scaling", "padded", "roofline", "small", "decode", "parallel", "latent", "quant_cache", "loops")
ASKED_FOR = ("loops",)  # whole models and their compiles: run only when named with --suite


QUICK_TIME_ZH = "机器空闲时全部测试组约需 1 到 2 分钟，机器忙时更久"
HELP = {  # option -> (English, Chinese)
    "suite": (f"run only this suite (repeatable): {', '.join(SUITES)} ({', '.join(ASKED_FOR)}: only when named)",
              f"只跑这一组测试（可以给多次）：{'、'.join(SUITES)}（{'、'.join(ASKED_FOR)} 只在点名时才跑）"),
    "quick": (f"small sizes and 3 rounds ({QUICK_TIME}); the run prints how long it took",
              f"用小尺寸，只跑 3 轮（{QUICK_TIME_ZH}）；跑完会打印实际用时"),
    "plot": ("write one PNG per suite into DIR", "每组测试画一张 PNG 图，存进 DIR"),
    "json": ("every number as one JSON line: on stdout with --json or --json -, else into PATH "
             "(without --json no file is written)",
             "把所有数字写成一行 JSON：只写 --json 或 --json - 时输出到标准输出，否则写进 PATH"
             "（不加 --json 就不写任何文件）"),
    "markdown": ("also write the tables as Markdown to PATH", "另外把各张表以 Markdown 格式写进 PATH"),
    "threads": ("torch intra-op threads (default: torch's choice)", "torch 算子内部用的线程数（默认由 torch 决定）"),
    "rounds": ("timed rounds per comparison (default 5, quick 3)", "每项对比计时的轮数（默认 5 轮，--quick 时 3 轮）"),
    "clock": ("wall: elapsed time (default); cpu: this process's CPU time, steadier on a busy machine "
              "(use with --threads 1)",
              "wall：实际经过的时间（默认）；cpu：本进程占用的 CPU 时间，机器忙时更稳定（请配合 --threads 1 使用）"),
    "no_progress": ("no progress bars", "不显示进度条"),
}


def configure(parser: argparse.ArgumentParser, lang: str = "en") -> None:
    """Add the bench subcommand's arguments, their help in `lang`."""
    text = help_texts(HELP, lang)
    parser.add_argument("--suite", action="append", choices=SUITES, metavar="NAME", help=text("suite"))
    parser.add_argument("--quick", action="store_true", help=text("quick"))
    parser.add_argument("--plot", metavar="DIR", help=text("plot"))
    parser.add_argument("--json", metavar="PATH", nargs="?", const="-", help=text("json"))
    parser.add_argument("--markdown", metavar="PATH", help=text("markdown"))
    parser.add_argument("--threads", type=int, help=text("threads"))
    parser.add_argument("--rounds", type=int, help=text("rounds"))
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall", help=text("clock"))
    parser.add_argument("--no-progress", action="store_true", help=text("no_progress"))


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
        for name in args.suite or [n for n in SUITES if n not in ASKED_FOR]:
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
    elif args.json:
        Path(args.json).write_text(line + "\n")
        print(f"multihead bench: every number, as one JSON line, is in {args.json}", file=sys.stderr)
    else:
        print("multihead bench: --json PATH keeps every number as one JSON line (--json alone: on stdout)",
              file=sys.stderr)
    if args.markdown:
        Path(args.markdown).write_text(report.markdown(results))
    if args.plot:
        for path in save_all(results, args.plot):
            print(f"plot: {path}")
    print(f"multihead bench: took {info['seconds']:.0f} s" + (" (--quick)" if args.quick else ""), file=sys.stderr)
    return 0
