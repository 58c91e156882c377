"""Mask: one structured attention mask; Part: one kind of mask or score term, knowing all its forms.

Shapes: B batch, H heads, Lq queries, Lk keys. Every mask broadcasts to (B, H, Lq, Lk).

A Mask is a tuple of parts combined with `&` (a key is kept where every part keeps it; additive
parts add up). A part is written once as a function of an `Index` (batch row, head, query position,
key position), and that one function gives every form a backend needs:

    keep(ix)        bool, True = may attend               (dense mask, Flex mask_mod, per-sequence slice)
    bias(ix, dtype) float added to the scaled scores      (dense bias, Flex score_mod)
    is_causal(ix)   the part is exactly SDPA's is_causal   (no dense mask at all)
    key_keep(ix)    (B, 1, 1, Lk) keys no query may see   (those keys are made inert)
    extents()       valid queries / keys per sequence     (the length-aware backend's slices)
    key_span(..)    the keys a block of queries may see   (the banded backend's blocks)
    slices(..)      the independent pieces of each row     (the length-aware backend's calls)
    key_interval(..) each row's kept keys [lo, hi)         (the decode kernel)
    distance_bias(ix) ALiBi's query positions and slopes   (the decode kernel)
    score(s, ix)    the scores after this part's term     (only parts with changes_scores, e.g. score_mod)

A part whose score term is not an addition (`changes_scores`, Mask.score_mod) makes every backend apply
the terms in the order of the parts, through `Mask.scores` (see `Mask.score_terms`). A part that calls a
user's function (`memo_safe = False`) may read tensors the mask cannot see, so its forms are never memoized.

So backends never ask which kind a part is, and a new kind is one file in this package.
Mask and every part are pytree nodes: torch.compile and torch.export take them as inputs.
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import torch
import torch.utils._pytree as pytree

from multihead.errors import AttentionError, shape_str
from multihead.masks.index import Index


class Part:
    """One kind of mask or score term. Subclasses are frozen dataclasses; see the module docstring."""

    tensor_fields: ClassVar[tuple[str, ...]] = ()  # the pytree leaves; every other field is static
    changes_scores: ClassVar[bool] = False  # its score term is `score`, not an added bias
    memo_safe: ClassVar[bool] = True  # its forms depend only on its tensor fields and the grid

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        pytree.register_pytree_node(
            cls, _flatten_part, lambda children, ctx, cls=cls: _unflatten_part(cls, children, ctx),
            serialized_type_name=f"multihead.masks.{cls.__name__}",
            flatten_with_keys_fn=_flatten_part_with_keys,
        )

    def check(self, B: int, H: int, Lq: int, Lk: int, device: torch.device) -> None:
        """Raise AttentionError unless the part fits (B, H, Lq, Lk) on `device`. Reads shapes, never values."""
        for name in self.tensor_fields:
            t = getattr(self, name)
            if t is not None and not same_device(t.device, device):
                raise AttentionError(f"mask is on {t.device} but the inputs are on {device}.")

    def keep(self, ix: Index) -> torch.Tensor | None:
        """Bool, True = may attend, broadcastable to the grid; None when the part blocks nothing."""
        return None

    def bias(self, ix: Index, dtype: torch.dtype) -> torch.Tensor | None:
        """Float added to the scaled scores, broadcastable to the grid; None when the part adds nothing."""
        return None

    def score(self, s: torch.Tensor, ix: Index) -> torch.Tensor:
        """The scores (broadcastable to the grid, softmax dtype) after this part's term: s + bias by default."""
        b = self.bias(ix, s.dtype)
        return s if b is None else s + b

    def is_causal(self, ix: Index) -> bool:
        """True when the part equals SDPA's top-left `is_causal` on this grid."""
        return False

    def key_keep(self, ix: Index) -> torch.Tensor | None:
        """(B, 1, 1, Lk) bool of keys some query may see, when the part blocks whole keys; else None."""
        return None

    def blocks_only_keys(self) -> bool:
        """Whether the part's keep is the same for every query and head: it blocks whole keys and nothing
        else (key padding, lengths (B,)). A structural fact, read from shapes, never from one grid."""
        return False

    def extents(self) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """(query_lens (B,) or None, key_lens (B,)) when the part limits each sequence's length."""
        return None

    def key_span(self, q_lo: int, q_hi: int, ix: Index) -> tuple[int, int] | None:
        """Keys [lo, hi) that queries [q_lo, q_hi) may keep, as host ints; None when unknown on the host."""
        return 0, ix.Lk

    def can_slice(self) -> bool:
        """Whether the part cuts each row into independent slices (see `slices`); shapes only."""
        return False

    def slices(self, Lq: int, Lk: int) -> list[tuple[int, int, int, int, int]] | str:
        """[(b, q_lo, q_hi, k_lo, k_hi)]: the only entries the part keeps, read on the host; or why not."""
        return "does not cut rows into slices"

    def key_interval(self, ix: Index, lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Each query row's kept keys [lo, hi), (B, Lq) int64 on the whole grid `ix`, narrowed by this part:
        the decode kernel's form. None (the default) when the part's keep is not one interval of keys
        per row. A part that blocks nothing returns them unchanged. Its score term must be none, or
        `distance_bias`."""
        return None

    def distance_bias(self, ix: Index) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(qpos (B, Lq) float32, slopes (H,) float32) when the part adds slopes[h] * (j - qpos[b, i]) to
        the scores (ALiBi), for the decode kernel; None (the default) for every other part."""
        return None

    def describe(self) -> str:
        return type(self).__name__


def _flatten_part(part):
    fields = [f.name for f in dataclasses.fields(part)]
    children = [getattr(part, n) for n in part.tensor_fields]
    static = tuple((n, getattr(part, n)) for n in fields if n not in part.tensor_fields)
    return children, static


def _flatten_part_with_keys(part):
    children, static = _flatten_part(part)
    keys = [pytree.GetAttrKey(n) for n in part.tensor_fields]
    return list(zip(keys, children)), static


def _unflatten_part(cls, children, static):
    return cls(**dict(zip(cls.tensor_fields, children)), **dict(static))


class Mask:
    """One structured attention mask. Build it with a constructor; combine with `&`.

    Constructors (each states its convention once; nothing is guessed from a dtype):
        Mask.keep(t)            True / 1 = the query may attend to the key
        Mask.block(t)           True / 1 = the query must not attend to the key
        Mask.additive(t)        a float added to the scaled scores; -inf blocks the key
        Mask.lengths(v, q)      key j is kept when j < v[b] (v: (B,) or (B, Lq)); query i >= q[b] is padding
        Mask.key_padding(t)     (B, Lk), True = padding key
        Mask.causal(align)      key j is kept when j <= i ("top_left") or, "bottom_right", when the last
                                valid query of each sequence lines up with its last valid key
        Mask.window(size)       key j is kept when i - size < j (a sliding window; combine with causal)
        Mask.alibi(slopes)      adds -slope[h] * (i - j) to the scores (ALiBi), never materialised early
        Mask.segments(ids)      packed sequences: attend only within the same segment id
        Mask.chunks(size)       key j is kept when it shares query i's chunk: i // size == j // size
        Mask.mask_mod(fn)       key j is kept where fn(b, h, i, j) is True (FlexAttention's mask_mod)
        Mask.score_mod(fn)      scores become fn(score, b, h, i, j) (FlexAttention's score_mod)
    """

    __slots__ = ("parts", "_memo", "tensors", "_extents", "_checked", "_combined", "transforms_scores",
                 "has_functions")

    def __init__(self, parts: tuple = ()):
        self.parts = tuple(parts)
        self._memo = None  # eager only: forms already built for a grid, so layers sharing a mask build them once
        self._checked = None  # eager only: the last (B, H, Lq, Lk, device) every part was checked against
        self._combined = None  # eager only: (other, self & other) for the last mask combined with `and_cached`
        # the parts' tensors (the pytree leaves), read without flattening: backends ask if any needs grad
        self.tensors = tuple(t for p in self.parts for t in (getattr(p, n) for n in p.tensor_fields) if t is not None)
        found = [e for e in (p.extents() for p in self.parts) if e is not None]
        self._extents = found[0] if len(found) == 1 else None
        self.transforms_scores = any(p.changes_scores for p in self.parts)  # a score_mod: see score_terms
        self.has_functions = not all(p.memo_safe for p in self.parts)  # captures the mask cannot see

    if TYPE_CHECKING:  # each kind's file adds its constructor at import (mask_constructor); typed here
        @classmethod
        def keep(cls, t: torch.Tensor | Sequence[Any]) -> Mask: ...
        @classmethod
        def block(cls, t: torch.Tensor | Sequence[Any]) -> Mask: ...
        @classmethod
        def additive(cls, t: torch.Tensor | Sequence[Any]) -> Mask: ...
        @classmethod
        def lengths(cls, valid_lens: torch.Tensor | Sequence[Any],
                    query_lens: torch.Tensor | Sequence[int] | None = None) -> Mask: ...
        @classmethod
        def key_padding(cls, t: torch.Tensor | Sequence[Any]) -> Mask: ...
        @classmethod
        def causal(cls, align: str = "top_left") -> Mask: ...
        @classmethod
        def window(cls, size: int, align: str = "top_left") -> Mask: ...
        @classmethod
        def alibi(cls, slopes: torch.Tensor | Sequence[float], align: str = "top_left") -> Mask: ...
        @classmethod
        def chunks(cls, size: int, align: str = "top_left") -> Mask: ...
        @classmethod
        def segments(cls, ids: torch.Tensor | Sequence[Any], key_ids: torch.Tensor | Sequence[Any] | None = None) -> Mask: ...
        @classmethod
        def mask_mod(cls, fn: Callable[..., torch.Tensor]) -> Mask: ...
        @classmethod
        def score_mod(cls, fn: Callable[..., torch.Tensor]) -> Mask: ...

    def __and__(self, other: Mask) -> Mask:
        if not isinstance(other, Mask):
            return NotImplemented
        return Mask(self.parts + other.parts)

    def and_cached(self, other: Mask) -> Mask:
        """`self & other`, the same Mask object each time for the same `other` (eager): so a call that
        adds causal=True to a reused mask keeps the combined mask's remembered checks, plan and forms."""
        if torch.compiler.is_compiling():  # read nothing remembered: eager calls may change it (no guards)
            return self & other
        combined = self._combined
        if combined is not None and combined[0] is other:
            return combined[1]
        result = self & other
        self._combined = (other, result)
        return result

    def __repr__(self) -> str:
        return "Mask(" + " & ".join(p.describe() for p in self.parts) + ")" if self.parts else "Mask()"

    # ---------------------------------------------------------------- checks and grids
    def check(self, B: int, H: int, Lq: int, Lk: int, device: torch.device) -> None:
        """Raise AttentionError unless every part fits (B, H, Lq, Lk) on `device`; reads no values.

        Checks read shapes and devices only, which a mask's tensors keep, so a mask reused at the
        same sizes is checked once (eager; under torch.compile the checks are traced every time).
        """
        if torch.compiler.is_compiling():  # never compare symbolic sizes with remembered ones (no guards)
            for part in self.parts:
                part.check(B, H, Lq, Lk, device)
            return
        signature = (B, H, Lq, Lk, device)
        if self._checked == signature:
            return
        for part in self.parts:
            part.check(B, H, Lq, Lk, device)
        self._checked = signature

    def extents(self) -> tuple[torch.Tensor | None, torch.Tensor] | None:
        """(query_lens or None, key_lens), each (B,), when exactly one part limits sequence lengths."""
        return self._extents

    def index(self, B: int, H: int, Lq: int, Lk: int, device, rows_may_shift: bool = False) -> Index:
        """The whole grid, with each sequence's extents when the mask has them."""
        ix = Index.grid(B, H, Lq, Lk, device, rows_may_shift)
        extents = self.extents()
        if extents is None:
            return ix
        q_lens, k_lens = extents
        return ix.with_extents(Lq if q_lens is None else ix.per_batch(q_lens), ix.per_batch(k_lens))

    # ---------------------------------------------------------------- forms
    def dense(self, ix: Index, dtype: torch.dtype = torch.float32, skip=()):
        """(keep, bias) on the grid, each broadcastable to it or None; bias is finite `dtype`."""
        keep = bias = None
        for part in self.parts:
            if part in skip or part in ix.satisfied:
                continue
            k = part.keep(ix)
            if k is not None:
                keep = k if keep is None else keep & k
            b = part.bias(ix, dtype)
            if b is not None:
                bias = b if bias is None else bias + b
        if bias is not None:
            bias = bias.clamp_min(torch.finfo(bias.dtype).min)  # -1e9 in fp16 stays finite, never -inf
        return keep, bias

    def scores(self, s: torch.Tensor, ix: Index) -> torch.Tensor:
        """s (scaled, softcapped scores in the softmax dtype) after every part's score term, in part order."""
        for part in self.parts:
            if part not in ix.satisfied:
                s = part.score(s, ix)
        return s

    def score_terms(self, ix: Index, dtype: torch.dtype = torch.float32):
        """(keep, bias) as in `dense`, except that when a part transforms the scores, bias is the function
        scores -> `self.scores(scores, ix)` (the reference math applies it in place of adding a bias)."""
        keep, bias = self.dense(ix, dtype)
        if self.transforms_scores:
            bias = functools.partial(self.scores, ix=ix)
        return keep, bias

    def causal_parts(self, ix: Index) -> tuple[Part, ...]:
        """The parts SDPA can take as is_causal=True on this grid."""
        return tuple(p for p in self.parts if p not in ix.satisfied and p.is_causal(ix))

    def memoized(self, key: tuple, build):
        """`build()`, remembered for `key` while the mask's tensors are unchanged (eager, no grad only)."""
        leaves = self.tensors
        if (self.has_functions or torch.compiler.is_compiling() or torch.jit.is_tracing() or torch.is_grad_enabled()
                and any(t.requires_grad for t in leaves)):
            return build()
        if leaves:
            if any(t.is_inference() for t in leaves):  # no version counter: an edit could not be seen
                return build()
            key = key + tuple(t._version for t in leaves)
        memo = self._memo  # read once: another thread may replace it between a check and a read
        if memo is None or memo[0] != key:
            memo = (key, build())
            self._memo = memo
        return memo[1]

    def only_key_blocks(self, ix: Index) -> bool:
        """Whether every part that blocks anything on this grid blocks whole keys (padding, lengths) and adds
        nothing. Each part says so from its own shapes (`Part.blocks_only_keys`): a grid with one query
        cannot tell a per-query mask from a per-key one."""
        for part in self.parts:
            if part in ix.satisfied:
                continue
            if part.bias(ix, torch.float32) is not None:
                return False
            if part.keep(ix) is not None and not part.blocks_only_keys():
                return False
        return True

    def key_span(self, q_lo: int, q_hi: int, ix: Index) -> tuple[int, int] | None:
        """Keys [lo, hi) that queries [q_lo, q_hi) may keep under every part; None when unknown."""
        lo, hi = 0, ix.Lk
        for part in self.parts:
            span = part.key_span(q_lo, q_hi, ix)
            if span is None:
                return None
            lo, hi = max(lo, span[0]), min(hi, span[1])
        return lo, max(lo, hi)

    def key_keep(self, ix: Index) -> torch.Tensor | None:
        """(B, 1, 1, Lk) bool: keys some query may see, where parts block whole keys; else None."""
        keep = None
        for part in self.parts:
            k = None if part in ix.satisfied else part.key_keep(ix)
            if k is not None:
                keep = k if keep is None else keep & k
        return keep

    def materialize(self, B: int, H: int, Lq: int, Lk: int, *, device=None, dtype=torch.float32):
        """Dense form, checked: (keep, bias), each broadcastable to (B, H, Lq, Lk) or None.

        keep is bool (True = attend); bias is `dtype`, added to the scaled scores.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        self.check(B, H, Lq, Lk, device)
        return self.dense(self.index(B, H, Lq, Lk, device), dtype)


def _flatten_mask(mask: Mask):
    return list(mask.parts), None


pytree.register_pytree_node(
    Mask, _flatten_mask, lambda parts, _: Mask(tuple(parts)), serialized_type_name="multihead.Mask",
    flatten_with_keys_fn=lambda m: ([(pytree.SequenceKey(i), p) for i, p in enumerate(m.parts)], None),
)


def mask_constructor(fn):
    """Make `fn(cls, ...)` the classmethod `Mask.<name>`: each kind's file declares its own constructors."""
    setattr(Mask, fn.__name__, classmethod(fn))
    return fn


def same_device(a: torch.device, b) -> bool:
    """Whether two devices are the same one ("cuda" and "cuda:0" are, for the current device)."""
    if a == b:
        return True
    b = torch.device(b)
    return a.type == b.type and (a.index == b.index or None in (a.index, b.index))


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
            and not torch.jit.is_tracing() and not _is_fake(t))


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import FakeTensor

    return isinstance(t, FakeTensor) or t.device.type == "meta"
