"""Mask: one structured attention mask, a tuple of parts combined with `&`.

Shapes: B batch, H heads, Lq queries, Lk keys. Every mask broadcasts to (B, H, Lq, Lk).

A key is kept where every part keeps it; additive terms add up; score functions apply in part order.
Each kind of part lives in its own file (part.py says what a part knows); the constructors below are
plain class methods that build one part each. A mask folds into its normal form (normal_form.py),
which is what backends read. Mask is a pytree node whose leaves are its parts' tensors, so
torch.compile and torch.export take masks as inputs.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from multihead.errors import AttentionError
from multihead.masks.additive import additive_part
from multihead.masks.alibi import alibi_part
from multihead.masks.causal import causal_part
from multihead.masks.chunks import chunks_part
from multihead.masks.keep import keep_part
from multihead.masks.lengths import lengths_part
from multihead.masks.mask_mod import mask_mod_part
from multihead.masks.normal_form import NormalForm, normal_form
from multihead.masks.part import Part, part_fields, part_tensors
from multihead.masks.score_mod import score_mod_part
from multihead.masks.segments import segments_part
from multihead.masks.sparse import sparse_part
from multihead.masks.window import window_part

TensorLike = torch.Tensor | Sequence[Any]


class Mask:
    """One structured attention mask. Build it with a constructor; combine with `&`.

    Each constructor states its convention once; nothing is guessed from a dtype.
    """

    __slots__ = ("parts", "_tensors", "_static", "_form")

    def __init__(self, parts: tuple = ()):
        self.parts = tuple(parts)
        self._tensors = None  # the parts' tensors, found on first use
        self._static = None  # the parts' kinds and static fields, for the plan cache's key
        self._form = None  # (value_key, its normal form), eager only

    # ---------------------------------------------------------------- constructors
    @classmethod
    def of(cls, *parts: Part) -> Mask:
        """A mask of one's own parts (subclasses of multihead.masks.Part: a new mask kind), kept where every part
        keeps a key: Mask.of(Band(3)) & Mask.causal(). A part says what it keeps or adds and how it folds
        (masks/part.py); every backend then takes it."""
        for part in parts:
            if not isinstance(part, Part):
                raise AttentionError(f"Mask.of takes mask parts (subclasses of multihead.masks.Part); got "
                                     f"{type(part).__name__}. For a tensor, say what it means: Mask.keep(t), "
                                     "Mask.additive(t), ...")
        return cls(parts)

    @classmethod
    def keep(cls, t: TensorLike) -> Mask:
        """True / 1 = the query may attend to the key. Bool or 0/1 numbers, broadcastable to (B, H, Lq, Lk)."""
        return cls((keep_part(t, "keep"),))

    @classmethod
    def block(cls, t: TensorLike) -> Mask:
        """True / 1 = the query must not attend to the key. Bool or 0/1 numbers, broadcastable to (B, H, Lq, Lk)."""
        return cls((keep_part(t, "block"),))

    @classmethod
    def key_padding(cls, t: TensorLike) -> Mask:
        """(B, Lk), True / 1 = padding key (the torch convention)."""
        return cls((keep_part(t, "key_padding"),))

    @classmethod
    def additive(cls, t: TensorLike) -> Mask:
        """A float added to the scaled scores, broadcastable to (B, H, Lq, Lk); -inf blocks the key."""
        return cls((additive_part(t),))

    @classmethod
    def lengths(cls, valid_lens: TensorLike, query_lens: TensorLike | None = None) -> Mask:
        """Key j is kept when j < valid_lens[b] (valid_lens (B,) or (B, Lq), d2l); query i >= query_lens[b]
        is padding. Padding queries, and queries with no valid key, give exactly zero output."""
        return cls((lengths_part(valid_lens, query_lens),))

    @classmethod
    def causal(cls, align: str = "top_left") -> Mask:
        """Key j is kept when j <= i ("top_left") or, "bottom_right", when the last valid query of each
        sequence lines up with its last valid key (j <= i + klen - qlen, per sequence with Mask.lengths)."""
        return cls((causal_part(align),))

    @classmethod
    def window(cls, size: int, align: str = "top_left") -> Mask:
        """Key j is kept when i - size < j: a sliding window (combine with causal). align as in Mask.causal
        ("bottom_right" when decoding with a KV cache)."""
        return cls((window_part(size, align),))

    @classmethod
    def chunks(cls, size: int, align: str = "top_left") -> Mask:
        """Key j is kept when it shares query i's chunk of `size` positions: i // size == j // size
        (Llama 4's chunked attention; combine with causal). align as in Mask.causal."""
        return cls((chunks_part(size, align),))

    @classmethod
    def alibi(cls, slopes: TensorLike, align: str = "top_left") -> Mask:
        """Adds -slopes[h] * (i - j) to the scaled scores (ALiBi; slopes (H,), e.g. mh.alibi_slopes(H)),
        never materialised early. align as in Mask.causal."""
        return cls((alibi_part(slopes, align),))

    @classmethod
    def segments(cls, ids: TensorLike, key_ids: TensorLike | None = None) -> Mask:
        """Packed sequences: ids (B, L) give each token's segment; tokens attend within their segment.
        For cross-attention pass the query ids (B, Lq) and the key ids (B, Lk)."""
        return cls((segments_part(ids, key_ids),))

    @classmethod
    def sparse(cls, indices: torch.Tensor) -> Mask:
        """Query i keeps only the keys it lists: indices (B, Lq, K) or (B, H, Lq, K), int32 or int64, -1 = none
        (FlashMLA's and vLLM's convention); a key listed twice is kept once."""
        return cls((sparse_part(indices),))

    @classmethod
    def mask_mod(cls, fn: Callable[..., torch.Tensor]) -> Mask:
        """Key j is kept where fn(b, h, i, j) is True (FlexAttention's mask_mod; integer index tensors)."""
        return cls((mask_mod_part(fn),))

    @classmethod
    def score_mod(cls, fn: Callable[..., torch.Tensor]) -> Mask:
        """The scores become fn(score, b, h, i, j) (FlexAttention's score_mod; integer index tensors)."""
        return cls((score_mod_part(fn),))

    # ---------------------------------------------------------------- combining and reading
    def __and__(self, other: Mask) -> Mask:
        if not isinstance(other, Mask):
            return NotImplemented
        return Mask(self.parts + other.parts)

    def __repr__(self) -> str:
        return "Mask(" + " & ".join(p.describe() for p in self.parts) + ")" if self.parts else "Mask()"

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        """The parts' tensors, in order: the mask's pytree leaves."""
        if torch.compiler.is_compiling():  # nothing remembered is read or written under torch.compile
            return tuple(t for p in self.parts for t in part_tensors(p))
        if self._tensors is None:
            self._tensors = tuple(t for p in self.parts for t in part_tensors(p))
        return self._tensors

    def check(self, B: int, H: int, Lq: int, Lk: int, device: torch.device) -> None:
        """Raise AttentionError unless every part fits (B, H, Lq, Lk) on `device`."""
        for part in self.parts:
            part.check(B, H, Lq, Lk, device)

    def normal_form(self) -> NormalForm:
        """The mask in the terms kernels take (see normal_form.py); folded again only when its value changed
        (eager: a tensor edited in place is a new value; under torch.compile it is folded afresh)."""
        if torch.compiler.is_compiling():
            return normal_form(self.parts)
        key, kept = self.value_key(), self._form
        if key is None or kept is None or kept[0] != key:
            kept = (key, normal_form(self.parts))
            if key is not None:
                self._form = kept
        return kept[1]

    def materialize(self, B: int, H: int, Lq: int, Lk: int, *, device=None, dtype=torch.float32):
        """Dense form, checked: (keep, bias), each broadcastable to (B, H, Lq, Lk) or None.

        keep is bool (True = attend); bias is `dtype`, added to the scaled scores.
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        self.check(B, H, Lq, Lk, device)
        form = self.normal_form()
        return form.dense(form.index(B, H, Lq, Lk, device), dtype)

    def value_key(self) -> tuple | None:
        """What the mask is, as a hashable value for the plan cache: each part's kind and static fields (a
        user's function by identity), and each tensor by identity, version and shape. None when a tensor
        has no version counter (an inference tensor), so an edit could not be seen."""
        static = self._static
        if static is None:
            static = self._static = tuple(_static_key(p) for p in self.parts)
        tensors = self.tensors
        if not tensors:
            return static
        if any(t.is_inference() for t in tensors):
            return None
        return static, tuple((id(t), t._version, t.shape, t.dtype, t.device) for t in tensors)


def _static_key(part: Part) -> tuple:
    """The part's kind and static fields (a user's function by identity), made once per part."""
    key = part.__dict__.get("_static_key")
    if key is None:
        key = (type(part), tuple((n, v) for n, v in part_fields(part) if not isinstance(v, torch.Tensor)))
        object.__setattr__(part, "_static_key", key)  # a frozen part's cache: not a field, not a pytree leaf
    return key


# ---------------------------------------------------------------- pytree: one registration, leaves = tensors
def flatten_parts(parts: tuple[Part, ...]) -> tuple[list[torch.Tensor], tuple]:
    """(the parts' tensors in order, a context of each part's kind, tensor field names and static fields)."""
    leaves, context = [], []
    for part in parts:
        fields = part_fields(part)
        leaves += [v for _, v in fields if isinstance(v, torch.Tensor)]
        context.append((type(part), tuple((n, isinstance(v, torch.Tensor), None if isinstance(v, torch.Tensor) else v)
                                          for n, v in fields)))
    return leaves, tuple(context)


def unflatten_parts(leaves, context) -> tuple[Part, ...]:
    """The parts `flatten_parts` took apart, with `leaves` in place of their tensors."""
    leaves, parts = iter(leaves), []
    for kind, fields in context:
        parts.append(kind(**{n: next(leaves) if is_tensor else v for n, is_tensor, v in fields}))
    return tuple(parts)


def flatten_keys(parts: tuple[Part, ...]) -> list:
    """pytree keys of the leaves `flatten_parts` gives: their positions."""
    return [pytree.SequenceKey(i) for i in range(len(flatten_parts(parts)[0]))]


def _flatten_mask(mask: Mask):
    return flatten_parts(mask.parts)


pytree.register_pytree_node(
    Mask, _flatten_mask, lambda leaves, context: Mask(unflatten_parts(leaves, context)),
    serialized_type_name="multihead.Mask",
    flatten_with_keys_fn=lambda m: (list(zip(flatten_keys(m.parts), flatten_parts(m.parts)[0])),
                                    flatten_parts(m.parts)[1]),
)
