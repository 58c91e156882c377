"""Shared checks of a mask's tensors: broadcasting, and whether reading their values is free."""
from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor

from multihead.errors import AttentionError, shape_str


def broadcasts(shape, target) -> bool:
    """Whether `shape` broadcasts to `target` (every dim 1 or equal, no more dims)."""
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def check_broadcast(t: torch.Tensor, B: int, H: int, Lq: int, Lk: int) -> None:
    if not broadcasts(t.shape, (B, H, Lq, Lk)):
        raise AttentionError(
            f"mask shape {shape_str(t.shape)} cannot broadcast to (B={B}, H={H}, Lq={Lq}, Lk={Lk}); "
            "expected (..., Lq, Lk) with every dim 1 or equal to the target."
        )


def values_checkable(t: torch.Tensor) -> bool:
    """Whether reading `t`'s values is free: a CPU tensor, outside torch.compile and tracing.

    Value checks (0/1 entries, non-negative lengths) run only then; on accelerators they would stall
    the device, and under torch.compile they would break the graph.
    """
    return (t.device.type == "cpu" and not torch.compiler.is_compiling()
            and not torch.jit.is_tracing() and not isinstance(t, FakeTensor))
