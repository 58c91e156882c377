"""The registry of `multihead explain` topics: one live answer per question in the seed documents.

TOPICS maps each kebab-case name to its Topic, ordered by document and then by the order the
document asks its questions. Each theme lives in its own module; this file only collects them.
"""
from __future__ import annotations

from multihead.explain.topics import heads, layout, masking, memory, python_syntax, scores
from multihead.explain.topics.base import Topic

_MODULES = (layout, memory, heads, python_syntax, scores, masking)


def _collect() -> dict[str, Topic]:
    found = [t for module in _MODULES for t in module.TOPICS]
    found.sort(key=lambda t: t.document)  # stable: keeps each module's question order
    registry: dict[str, Topic] = {}
    for t in found:
        if t.name in registry:
            raise RuntimeError(f"two topics are named {t.name!r}")
        registry[t.name] = t
    return registry


TOPICS: dict[str, Topic] = _collect()

__all__ = ["TOPICS", "Topic"]
