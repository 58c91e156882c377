"""A causal mask the learner's code builds during a call but never applies (``causal-mask-unused``).

A module that behaves as plain non-causal attention would pass; but if its own forward builds a causal
pattern (``torch.tril(torch.ones(L, L))``, ``triu(..., 1)``, ``positions[:, None] >= positions[None, :]``)
and nothing computed from that pattern reaches the output, the learner meant it to be causal and lost the
mask on the way: ``scores.masked_fill(mask, -inf)`` with its result thrown away, or a mask built and never
handed to the attention function (a common slip in course adapters).

``CausalPatterns`` is a ``TorchFunctionMode`` watching one call: the (L, L) causal patterns made during it
(the seeds) and every tensor computed from them (the taint, through any op, in place or not).
"""

from __future__ import annotations

import traceback

import torch
from torch.overrides import TorchFunctionMode

from multihead.checker.loading.calling import CallSpec, LearnerError, first_tensor, invoke, learner_line
from multihead.convert.dataflow_ops import flat_tensors

_MAKERS = {"tril", "triu", "tril_", "triu_", "ge", "gt", "le", "lt", "__ge__", "__gt__", "__le__", "__lt__"}


def _is_causal_pattern(t: torch.Tensor, length: int) -> bool:
    """Is ``t`` (..., L, L) the same causal pattern (a lower or upper triangle, diagonal in or out) in
    every leading position?"""
    if t.dim() < 2 or tuple(t.shape[-2:]) != (length, length) or t.is_complex():
        return False
    flat = t.detach().reshape(-1, length, length)
    if not bool((flat == flat[:1]).all()):
        return False
    marked = flat[0] != 0 if flat.dtype != torch.bool else flat[0]
    ones = torch.ones(length, length, dtype=torch.bool)
    return any(torch.equal(marked, pattern) for pattern in (ones.tril(), ones.tril(-1), ones.triu(), ones.triu(1)))


class CausalPatterns(TorchFunctionMode):
    """Watch one call on sequences of ``length`` tokens: ``built`` the learner's line that made the first causal
    pattern ("" if none was made), ``tainted`` the ids of every tensor computed from one."""

    def __init__(self, length: int):
        super().__init__()
        self.length = length
        self.built = ""
        self.tainted: set[int] = set()
        self._alive: list[torch.Tensor] = []  # keeps the ids unique during the call

    def _taint(self, tensors) -> None:
        for tensor in tensors:
            self.tainted.add(id(tensor))
            self._alive.append(tensor)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        given = flat_tensors((args, kwargs))
        if any(id(t) in self.tainted for t in given):
            self._taint(flat_tensors(out))
            if func is torch.Tensor.__setitem__ and given:  # a cache or scores written with masked values
                self._taint(given[:1])
        elif getattr(func, "__name__", "") in _MAKERS and isinstance(out, torch.Tensor) and \
                _is_causal_pattern(out, self.length):
            self.built = self.built or learner_line(traceback.extract_stack()[:-1])
            self._taint([out])
        return out


def _watched(module, spec: CallSpec, x: torch.Tensor) -> tuple[CausalPatterns, torch.Tensor] | None:
    watch = CausalPatterns(x.shape[1])
    try:
        with torch.no_grad(), watch:
            out = invoke(module, spec, x)
    except LearnerError:
        return None
    return watch, first_tensor(out)


def unused_causal_mask(module, spec: CallSpec, x: torch.Tensor) -> str | None:
    """The learner's line that builds a causal mask never applied in a call of self-attention on x (B, L, E)
    (the line may be "" when it is not in the learner's files), or None when the call builds none or uses it."""
    found = _watched(module, spec, x)
    if found is None or not found[0].tainted or id(found[1]) in found[0].tainted:
        return None
    return found[0].built


def applies_causal_mask(module, spec: CallSpec, x: torch.Tensor) -> bool:
    """Does a call on x (B, L, E) build a causal pattern that reaches the output? (A module whose behaviour
    does not show it as causal, e.g. with a softmax over the queries, which lets later tokens move earlier
    outputs, is then named under a causal mask.)"""
    found = _watched(module, spec, x)
    return found is not None and id(found[1]) in found[0].tainted
