"""matplotlib figures, one PNG per suite, written by `multihead bench --plot DIR`."""
from __future__ import annotations

import textwrap
from pathlib import Path

from multihead.bench.results import SuiteResult
from multihead.bench.suites.parallel import plot


def save_all(results: list[SuiteResult], directory: str | Path) -> list[Path]:
    """Write a figure for each suite that has one; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for r in results:
        draw = DRAWERS.get(r.suite)
        if draw is None:
            continue
        fig = draw(plt, r)
        fig.tight_layout()
        path = directory / f"{r.suite}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def _shootout(plt, r: SuiteResult):
    names = [row["implementation"] for row in r.rows]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(names) + 1.5))
    ys = range(len(names))
    ax.barh([y - 0.2 for y in ys], [row["forward x ours"] for row in r.rows], 0.4, label="forward")
    ax.barh([y + 0.2 for y in ys], [row["fwd+bwd x ours"] for row in r.rows], 0.4, label="forward+backward")
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set_yticks(list(ys), names)
    ax.invert_yaxis()
    ax.set_xlabel("time / ours (higher = slower than ours)")
    ax.set_title(r.title, fontsize=9)
    ax.legend()
    return fig


def _scaling(plt, r: SuiteResult):
    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(10, 4))
    time_cols = [c for c in r.columns if c.endswith(" ms")]
    for col, label in zip(time_cols, ("ours", "textbook (N^2 scores)")):
        pts = [(row["N"], row[col]) for row in r.rows if row[col] is not None]
        if pts:
            t_ax.plot(*zip(*pts), marker="o", label=label)
    for col, label in (("ours peak MiB", "ours"), ("textbook peak MiB", "textbook (N^2 scores)")):
        pts = [(row["N"], row[col]) for row in r.rows if row[col] is not None]
        if pts:
            m_ax.plot(*zip(*pts), marker="o", label=label)
    m_ax.axhline(1024, color="grey", linestyle="--", label="1 GiB")
    for ax, ylabel in ((t_ax, "ms per forward"), (m_ax, "peak RSS, MiB")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N")
        ax.set_ylabel(ylabel)
        ax.legend()
    fig.suptitle(r.title, fontsize=9)
    return fig


def _bars(plt, r: SuiteResult, label_of, value_col: str, xlabel: str):
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(r.rows) + 1.5))
    labels = [label_of(row) for row in r.rows]
    ax.barh(range(len(labels)), [row[value_col] for row in r.rows])
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(textwrap.fill(r.title, 70), fontsize=9)
    return fig


def _padded(plt, r: SuiteResult):
    return _bars(plt, r, lambda row: f"{row['padding']} {row['pass']}: {row['implementation']}", "ms", "ms per call")


def _roofline(plt, r: SuiteResult):
    rows = SuiteResult(r.suite, r.title, r.columns, [x for x in r.rows if x.get("% of GEMM") is not None])
    return _bars(plt, rows, lambda row: f"{row['measurement']} {row['dtype']}"
                 + ("" if row["causal"] is None else (" causal" if row["causal"] else "")),
                 "% of GEMM", "% of the same dtype's GEMM rate")


def _small(plt, r: SuiteResult):
    return _bars(plt, r, lambda row: f"{row['mask']}: {row['implementation']}", "us", "microseconds per call")


def _parallel(plt, r: SuiteResult):
    return plot(plt, r)


def _quant_cache(plt, r: SuiteResult):
    return _bars(plt, r, lambda row: f"{row['case'].split(': ')[-1]}: {row['implementation']}", "ms", "ms per call")


DRAWERS = {"shootout": _shootout, "scaling": _scaling, "padded": _padded, "roofline": _roofline,
           "small": _small, "parallel": _parallel, "quant_cache": _quant_cache}
