"""The package's doors to its tools: every tool loads on first use, through the one table below.

`import multihead` loads the core alone (attention, masks, backends, the module, the cache, positions,
capture). A tool is reached in one of two ways, both listed in TOOLS:
- as an attribute of the package (`mh.check`, `mh.explain(...)`, `mh.compat`): multihead/__init__.py's
  __getattr__ (PEP 562) loads it;
- as a service a core class offers (`MultiHeadAttention.from_module`, a capture record's `_repr_html_`):
  the class's plain method calls `multihead.services.service(name)`, and `wire()` below gives SERVICES a
  loader for each.
This module and __init__.py are the package's facade, like cli.py: they alone import tools, by name and
on first use, so no import cycle exists, hidden or not: the tools import the core at their top, and
nothing the core imports reaches back to them.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

from multihead.services import SERVICES

# name -> (module, attribute or None for the module itself)
TOOLS = {
    "check": ("multihead.checker", "check"),
    "explain": ("multihead.explain", None),
    "compat": ("multihead.compat", None),
    "textbook": ("multihead.textbook", None),
}
SERVICE_TOOLS = {
    "from_module": ("multihead.convert.registry", "from_module"),
    "to_torch": ("multihead.convert.to_torch", "to_torch"),
    "latent_from_module": ("multihead.convert.hf.latent", "latent_from_module"),
    "shared_kv_from_module": ("multihead.convert.hf.deepseek_v4", "shared_kv_from_module"),
    "record_html": ("multihead.explain.notebook", "record_html"),
}


def load(module_name: str, attribute: str | None):
    """The tool module `module_name` (imported on first use), or its `attribute`."""
    module = importlib.import_module(module_name)
    return module if attribute is None else getattr(module, attribute)


def _loader(module_name: str, attribute: str) -> Callable[[], Callable]:
    return lambda: load(module_name, attribute)


def wire() -> None:
    """Give every service its loader (idempotent)."""
    for name, (module_name, attribute) in SERVICE_TOOLS.items():
        SERVICES.setdefault(name, _loader(module_name, attribute))


wire()
