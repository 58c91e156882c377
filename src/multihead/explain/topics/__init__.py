"""The registry of `multihead explain` topics: one live answer per question.

Every module in this package that defines topics (with the `@topic` decorator) is found by itself;
TOPICS lists them in the order the words files give (the documents' own question order, document
000 first, then the project's own questions). Adding a topic is writing its function in a module
here (or in models/, for the topics on particular models) and its words under its name in words/en.json
and words/zh.json.
"""
from __future__ import annotations

import importlib
import pkgutil

from multihead.explain import words
from multihead.explain.topics.base import Topic


def _collect() -> dict[str, Topic]:
    found: dict[str, Topic] = {}
    for info in pkgutil.walk_packages(__path__, f"{__name__}."):
        module = importlib.import_module(info.name)
        for value in vars(module).values():
            if isinstance(value, Topic) and found.setdefault(value.name, value) is not value:
                raise RuntimeError(f"two topics are named {value.name!r}")
    missing = set(found) ^ set(ORDER)
    if missing:
        raise RuntimeError(f"topics in the code and in the words files disagree on: {sorted(missing)}")
    return {name: found[name] for name in ORDER}


ORDER: tuple[str, ...] = tuple(words.words("en")["topics"])
TOPICS: dict[str, Topic] = _collect()

__all__ = ["ORDER", "TOPICS", "Topic"]
