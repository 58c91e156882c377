"""`multihead explain`: multi-head attention taught on live, checked tensors, in English and Chinese.

The command lives in cli.py; `mh.explain(...)` is this package called like a function: it is
notebook.explain, which returns an Explanation that Jupyter draws as the interactive page. The
package stays a package (`import multihead.explain.walkthrough` keeps working), it only also
answers calls, so that the function and the package can share the name `explain`.
"""
from __future__ import annotations

import sys
import types

from multihead.explain.notebook import explain


class _CallablePackage(types.ModuleType):
    def __call__(self, topic: str | None = None, *, text: str | None = None, layer: int = 0,
                 lang: str | None = None):
        """mh.explain(topic=None, *, text=None, layer=0, lang=None): see multihead.explain.notebook.explain."""
        return explain(topic, text=text, layer=layer, lang=lang)


sys.modules[__name__].__class__ = _CallablePackage
