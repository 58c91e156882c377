"""The registry of `multihead explain` topics: one live answer per question in the seed documents.

TOPICS maps each kebab-case name to its Topic, in the order the documents ask their questions
(document 000 first). Each theme lives in its own module; this file only collects and orders them.
"""
from __future__ import annotations

from multihead.explain.topics import heads, heads_meaning, layout, masking, memory, python_syntax, scores
from multihead.explain.topics.base import Topic

_MODULES = (layout, memory, heads, python_syntax, scores, masking, heads_meaning)

# The documents' own question order.
ORDER = (
    "reshape-then-transpose", "memory-order",                                   # 000
    "stacked-vs-split", "view-vs-contiguous",                                   # 001
    "linear-d-model", "k-transpose", "masked-fill", "mask-fill-value",          # 002
    "size-unpacking", "split-heads-transpose", "underscore-placeholder", "combine-heads", "farward-typo",
    "einsum-scores", "mask-asserts", "scale-sqrt-dk",                           # 003
    "where-heads-live", "heads-in-batch", "head-cost", "param-count", "heads-vs-conv",   # 004
)


def _collect() -> dict[str, Topic]:
    found: dict[str, Topic] = {}
    for module in _MODULES:
        for t in module.TOPICS:
            if t.name in found:
                raise RuntimeError(f"two topics are named {t.name!r}")
            found[t.name] = t
    missing = set(found) ^ set(ORDER)
    if missing:
        raise RuntimeError(f"topics and ORDER disagree on: {sorted(missing)}")
    return {name: found[name] for name in ORDER}


TOPICS: dict[str, Topic] = _collect()

__all__ = ["ORDER", "TOPICS", "Topic"]
