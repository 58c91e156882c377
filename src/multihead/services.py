"""The tools' services on core objects: the core calls them by name, the package wires them in.

A few methods users expect on core classes are a tool's work:

    MultiHeadAttention.from_module(other)   convert: weights from another attention module
    MultiHeadAttention.to_torch()           convert: an equal nn.MultiheadAttention
    MultiHeadLatentAttention.from_module    convert: a DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention layer
    SharedKVAttention.from_module           convert: a DeepSeek V4 attention layer
    record._repr_html_()                    explain: a capture record drawn as the interactive page

The classes define them as plain methods (so readers and type checkers see them where they belong)
whose bodies call `service(name)(...)`. The package facade (multihead/doors.py, run by `import
multihead`) fills SERVICES with one loader per name, which imports its tool on first use. So the core
never imports a tool, no class is patched from outside, and `import multihead` loads the core alone.
"""
from __future__ import annotations

from collections.abc import Callable

SERVICES: dict[str, Callable[[], Callable]] = {}  # name -> loader of the tool's function


def service(name: str) -> Callable:
    """The tool function behind `name` (its tool imported on first use)."""
    loader = SERVICES.get(name)
    if loader is None:
        raise RuntimeError(f"no tool provides {name!r}: import multihead (the package) to wire in the tools")
    return loader()
