"""`multihead check` as a learner runs it: one new process per check, start-up included, over the zoo.

Every zoo module (tests/check_zoo: the correct ones with the options the zoo gives them, and the buggy
ones) is checked by ``python -m multihead check FILE.py:Class [--init JSON] [--config JSON] --lang L`` in
a fresh process, in English and in Chinese; the wall time of each process is one sample. The goal: the
95th percentile at most 3 s on 2 cores.

    python benchmarks/check_cli_time.py [--rounds N] [--lang en --lang zh] [--limit N]

prints a table (wall p50, p95, max and CPU-time p50, p95 per language: on a machine shared with other
jobs the CPU time, user + system of the child, is the steadier figure), the slowest checks, then one JSON
line. The rounds are interleaved (every target once per round, the languages alternating), so a burst of
load from other jobs spreads over all targets instead of landing on one.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from check_heldout import _children_cpu, percentile  # noqa: E402 (the held-out zoo's clocks and quantile)
from zoo_modules import BUGGY, CORRECT  # noqa: E402
from zoo_mutants import target_path  # noqa: E402


def command(target: str, options: dict, lang: str) -> list[str]:
    """The command line a learner types for one zoo target, with the zoo's hints as options."""
    argv = [sys.executable, "-m", "multihead", "check", target_path(target), "--lang", lang]
    for name in ("init", "config"):
        if name in options:
            argv += [f"--{name}", json.dumps(options[name])]
    return argv


def targets() -> list[tuple[str, dict]]:
    return list(CORRECT.items()) + [(target, {}) for target in BUGGY]


def run(rounds: int, langs: list[str], limit: int | None) -> dict:
    chosen = targets()[:limit]
    samples: dict[str, list[tuple[str, float, float, int]]] = {lang: [] for lang in langs}
    env = {**os.environ, "COLUMNS": "100"}
    for round_index in range(rounds):
        for index, (target, options) in enumerate(chosen):
            order = langs if (index + round_index) % 2 == 0 else langs[::-1]
            for lang in order:
                cpu_before, start = _children_cpu(), time.perf_counter()
                done = subprocess.run(command(target, options, lang), capture_output=True, env=env)
                samples[lang].append((target, time.perf_counter() - start, _children_cpu() - cpu_before,
                                      done.returncode))
    summary = {}
    for lang, rows in samples.items():
        times, cpu = [row[1] for row in rows], [row[2] for row in rows]
        summary[lang] = {"checks": len(times), "p50_s": round(statistics.median(times), 2),
                         "p95_s": percentile(times, 0.95), "max_s": round(max(times), 2),
                         "cpu_p50_s": round(statistics.median(cpu), 2), "cpu_p95_s": percentile(cpu, 0.95),
                         "exit_2": sum(row[3] == 2 for row in rows)}
    slowest = sorted(((row[2], row[1], lang, row[0]) for lang, rows in samples.items() for row in rows),
                     reverse=True)[:8]
    return {"summary": summary, "slowest_by_cpu": [[round(c, 2), round(s, 2), lang, t] for c, s, lang, t in slowest],
            "cores": os.cpu_count(), "load_average": [round(x, 2) for x in os.getloadavg()],
            "python": sys.version.split()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1, help="times every target is checked per language")
    parser.add_argument("--lang", action="append", choices=("en", "zh"), help="default: both")
    parser.add_argument("--limit", type=int, default=None, help="only the first N targets")
    args = parser.parse_args()
    result = run(args.rounds, args.lang or ["en", "zh"], args.limit)
    print(f"{'lang':6s}{'checks':>8s}{'p50 s':>8s}{'p95 s':>8s}{'max s':>8s}{'cpu p50':>9s}{'cpu p95':>9s}"
          f"{'exit 2':>8s}")
    for lang, row in result["summary"].items():
        print(f"{lang:6s}{row['checks']:8d}{row['p50_s']:8.2f}{row['p95_s']:8.2f}{row['max_s']:8.2f}"
              f"{row['cpu_p50_s']:9.2f}{row['cpu_p95_s']:9.2f}{row['exit_2']:8d}")
    print("slowest (CPU s, wall s):",
          "; ".join(f"{t} ({lang}) {c:.2f}, {s:.2f}" for c, s, lang, t in result["slowest_by_cpu"]))
    print(f"{result['cores']} cores, load average at the end {result['load_average']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
