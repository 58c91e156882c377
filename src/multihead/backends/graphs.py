"""Two questions about the graph a call may be part of, asked the same way everywhere.

    building_graph()   torch.compile, torch.export, ONNX or torch.jit.trace is building a graph: tensors hold no
                       values to read on the host, and nothing remembered may be read (it would not be guarded)
    recorded_graph()   the graph is recorded to be replayed elsewhere (torch.export, ONNX, torch.jit.trace): it
                       keeps to torch's own ops, so a raw call into a compiled extension would not be replayed
"""
from __future__ import annotations

import torch

__all__ = ["building_graph", "recorded_graph"]


def building_graph() -> bool:
    """Whether a graph is being built around this call (torch.compile, export, ONNX, torch.jit.trace). (The
    tracer's own flag, read only outside torch.compile: dynamo cannot trace the call that reads it.)"""
    return torch.compiler.is_compiling() or torch._C._is_tracing()


def recorded_graph() -> bool:
    """Whether the call is being recorded into a graph that keeps to torch's own ops (torch.export, ONNX,
    torch.jit.trace)."""
    return torch.compiler.is_exporting() or torch.jit.is_tracing()
