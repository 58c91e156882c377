"""Run a function on a small group of local processes joined by torch.distributed: tests, benchmarks.

    results = run_local(fn, 4, arg1, arg2)   # fn(arg1, arg2) on ranks 0..3; one result per rank

Each rank is a fresh process (forked from a server that imported torch once, so a group starts in
a fraction of a second) that joins a gloo group on 127.0.0.1 at a free port, with a timeout on
every collective; the whole run has a deadline too, so a hang ends as an error, never a stuck test.
"""
from __future__ import annotations

import datetime
import multiprocessing as mp
import queue
import socket
import time
import traceback

PRELOAD = ["torch", "torch.distributed", "torch._dynamo", "torch.distributed.tensor.parallel", "multihead.parallel"]


class GroupFailed(RuntimeError):
    """A rank raised, or the group ran past its deadline; the message holds every rank's traceback."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_local(fn, world_size: int, *args, timeout_s: float = 120.0, collective_timeout_s: float = 30.0,
              threads: int = 1, backend: str = "gloo") -> list:
    """fn(*args) on `world_size` local processes forming one group; the return values in rank order.

    fn and its arguments and results must pickle (fn defined at a module's top level). Each process
    uses `threads` torch threads. Raises GroupFailed if a rank raises or the run passes `timeout_s`.
    """
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(fn, args, rank, world_size, port, backend, collective_timeout_s, threads, results))
             for rank in range(world_size)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    reported: dict[int, tuple[bool, object]] = {}
    try:
        _collect(results, procs, reported, deadline)
    finally:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()) if len(reported) == world_size else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    failed = {r: v for r, (ok, v) in reported.items() if not ok}
    missing = [r for r in range(world_size) if r not in reported]
    if failed or missing:
        lines = [f"rank {r} raised:\n{tb}" for r, tb in sorted(failed.items())]
        if missing:
            lines.append(f"ranks {missing} reported nothing: they died, or ran past {timeout_s:.0f} s and were killed")
        raise GroupFailed("\n".join(lines))
    return [reported[r][1] for r in range(world_size)]


def _collect(results, procs, reported: dict, deadline: float) -> None:
    """Read (rank, ok, value) reports until every rank reported, one died silently, or the deadline."""
    silent_since = None
    while len(reported) < len(procs) and time.monotonic() < deadline:
        try:
            rank, ok, value = results.get(timeout=0.2)
            reported[rank] = (ok, value)
            continue
        except queue.Empty:
            pass
        dead = [r for r, p in enumerate(procs) if r not in reported and p.exitcode is not None]
        if dead:  # give a report already in the pipe a moment to arrive, then stop waiting
            silent_since = silent_since or time.monotonic()
            if time.monotonic() - silent_since > 2.0:
                return


def _rank_main(fn, args, rank, world_size, port, backend, collective_timeout_s, threads, results) -> None:
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(threads)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
        try:
            value = fn(*args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException:  # noqa: BLE001 (the parent reports it with the traceback)
        results.put((rank, False, traceback.format_exc()))


_CONTEXT = None


def _context():
    """forkserver where the platform has it (preloading torch once), else spawn."""
    global _CONTEXT
    if _CONTEXT is None:
        if "forkserver" in mp.get_all_start_methods():
            _CONTEXT = mp.get_context("forkserver")
            _CONTEXT.set_forkserver_preload(PRELOAD)
        else:
            _CONTEXT = mp.get_context("spawn")
    return _CONTEXT
