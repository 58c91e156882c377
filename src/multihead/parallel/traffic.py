"""Count the bytes this rank sends, by watching every tensor that passes through a collective.

    with count_traffic(group) as traffic:
        out = ring_attention(q, k, v, causal=True, layout="zigzag")
        out.sum().backward()
    traffic.sent["p2p"]  # bytes this rank sent point to point

A TorchDispatchMode sees every torch.distributed operation this process runs: the c10d ops behind
send/recv, all_to_all_single, all_gather and all_reduce, and the functional collectives DTensor
issues. Each is turned into the bytes one rank puts on the wire under the bandwidth-optimal
algorithm for that collective (what NCCL's ring and pairwise algorithms move):

    send                 the tensor
    all_to_all           the input less the chunk the rank keeps for itself
    all_gather           (P-1) x the rank's input            (each rank's piece reaches P-1 others)
    all_reduce           2 (P-1)/P x the tensor              (reduce-scatter, then all-gather)
    reduce_scatter       (P-1)/P x the input

All ops are assumed to run on the one group passed in. Counting slows every op down: measure
traffic and time in separate runs.
"""
from __future__ import annotations

from collections import Counter

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from multihead.parallel.comm import resolve_group


def nbytes(tensors) -> int:
    """Bytes of a tensor or a (nested) list of tensors."""
    if isinstance(tensors, torch.Tensor):
        return tensors.numel() * tensors.element_size()
    return sum(nbytes(t) for t in tensors)


class count_traffic(TorchDispatchMode):  # noqa: N801 (used as a context manager, like torch's modes)
    """Context manager: `sent` and `calls` per kind ("p2p", "all_to_all", "all_gather", "all_reduce",
    "reduce_scatter"), in bytes this rank sends and operations it joins; `received` for p2p."""

    def __init__(self, group=None):
        super().__init__()
        pg = resolve_group(group)
        self.world_size, self.rank = dist.get_world_size(pg), dist.get_rank(pg)
        self.sent: Counter = Counter()
        self.received: Counter = Counter()
        self.calls: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.sent.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kind, sent = self._measure(func.__name__.split(".")[0].rstrip("_"), func.namespace, args)
        if kind is not None:
            self.calls[kind] += 1
            self.sent[kind] += sent
        return func(*args, **(kwargs or {}))

    def _measure(self, name: str, namespace: str, args) -> tuple[str | None, int]:
        P = self.world_size
        if namespace == "c10d":
            if name == "send":
                return "p2p", nbytes(args[0])
            if name == "recv":
                self.received["p2p"] += nbytes(args[0])
                return None, 0
            if name == "alltoall_base":
                return "all_to_all", self._all_to_all(args[1], args[4])
            if name == "allgather":
                return "all_gather", (P - 1) * nbytes(args[1])
            if name == "allreduce":
                return "all_reduce", 2 * (P - 1) * nbytes(args[0]) // P
        if namespace == "_c10d_functional":
            if name == "all_reduce":
                return "all_reduce", 2 * (P - 1) * nbytes(args[0]) // P
            if name == "all_gather_into_tensor":
                return "all_gather", (P - 1) * nbytes(args[0])
            if name == "reduce_scatter_tensor":
                return "reduce_scatter", (P - 1) * nbytes(args[0]) // P
            if name == "all_to_all_single":
                return "all_to_all", self._all_to_all(args[0], args[2])
        return None, 0

    def _all_to_all(self, x: torch.Tensor, in_splits) -> int:
        """Bytes of `x` that leave this rank: all but the chunk addressed to itself."""
        rows = x.shape[0] if x.dim() else 1
        kept = in_splits[self.rank] if in_splits else rows // self.world_size
        return (rows - kept) * (nbytes(x) // max(rows, 1))
