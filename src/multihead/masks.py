"""Mask: every masking convention in, each backend's form out.

Shapes: B batch, H heads, Lq queries, Lk keys. Every mask broadcasts to (B, H, Lq, Lk).

Each constructor states its convention once, and nothing is ever guessed from a dtype:

    Mask.keep(t)          True / 1 = the query may attend to the key
    Mask.block(t)         True / 1 = the query must not attend to the key
    Mask.additive(t)      a float added to the scaled scores; -inf blocks the key
    Mask.lengths(v, q)    key j is kept when j < v[b] (v: (B,) or (B, Lq)); query i >= q[b] is padding
    Mask.key_padding(t)   (B, Lk), True = padding key
    Mask.causal(align)    key j is kept when j <= i ("top_left") or j <= i + Lk - Lq ("bottom_right")

`a & b` keeps a key only where both keep it (additive parts add up). A mask keeps its structure:
backends read `parts` and choose their own form (SDPA's is_causal, per-sequence slices, dense tensors).
A query row that keeps no key at all gives an output of exactly zero, on every backend.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.errors import AttentionError, shape_str

ALIGNS = ("top_left", "bottom_right")


@dataclass(frozen=True, eq=False)
class KeepPart:
    """A dense keep tensor, bool, broadcastable to (B, H, Lq, Lk)."""

    keep: torch.Tensor


@dataclass(frozen=True, eq=False)
class BiasPart:
    """A finite float added to the scaled scores, broadcastable to (B, H, Lq, Lk)."""

    bias: torch.Tensor


@dataclass(frozen=True, eq=False)
class LengthsPart:
    """Valid key counts (B,) or (B, Lq); optional valid query counts (B,)."""

    key_lens: torch.Tensor
    query_lens: torch.Tensor | None = None


@dataclass(frozen=True)
class CausalPart:
    align: str = "top_left"


class Mask:
    """One structured attention mask. Build it with a constructor; combine with `&`."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple = ()):
        self.parts = tuple(parts)

    # ---------------------------------------------------------------- constructors
    @classmethod
    def keep(cls, t) -> Mask:
        """True / 1 = may attend. Bool or 0/1 numeric, broadcastable to (B, H, Lq, Lk)."""
        return cls((KeepPart(_as_bool(t, "Mask.keep")),))

    @classmethod
    def block(cls, t) -> Mask:
        """True / 1 = must not attend. Bool or 0/1 numeric, broadcastable to (B, H, Lq, Lk)."""
        return cls((KeepPart(~_as_bool(t, "Mask.block")),))

    @classmethod
    def additive(cls, t) -> Mask:
        """A float added to the scaled scores (broadcastable to (B, H, Lq, Lk)); -inf blocks."""
        t = torch.as_tensor(t)
        if not t.is_floating_point():
            raise AttentionError(
                f"Mask.additive expects a floating tensor of score offsets; got dtype {t.dtype}. "
                "For 0/1 or bool masks use Mask.keep (1 = attend) or Mask.block (1 = blocked)."
            )
        if torch.isnan(t).any() or torch.isposinf(t).any():
            raise AttentionError("Mask.additive expects finite values or -inf; got NaN or +inf.")
        blocked = torch.isneginf(t)
        if not blocked.any():
            return cls((BiasPart(t),))
        # -inf is structure, not arithmetic: keep it as a blocked key so rows stay NaN-free.
        return cls((BiasPart(t.masked_fill(blocked, 0.0)), KeepPart(~blocked)))

    @classmethod
    def lengths(cls, valid_lens, query_lens=None) -> Mask:
        """Keys j < valid_lens[b] (or [b, i]) are kept (d2l); queries i >= query_lens[b] are padding.

        valid_lens: (B,) or (B, Lq) non-negative integers. query_lens: (B,) or None. Padding queries
        (and queries with no valid key) give exactly zero output.
        """
        key_lens = _as_lengths(valid_lens, "valid_lens", ndims=(1, 2))
        q_lens = None if query_lens is None else _as_lengths(query_lens, "query_lens", ndims=(1,))
        if q_lens is not None and q_lens.shape[0] != key_lens.shape[0]:
            raise AttentionError(
                f"query_lens has {q_lens.shape[0]} entries but valid_lens has {key_lens.shape[0]}; "
                "expected one per batch element."
            )
        return cls((LengthsPart(key_lens, q_lens),))

    @classmethod
    def key_padding(cls, t) -> Mask:
        """(B, Lk), True / 1 = padding key (the torch convention)."""
        pad = _as_bool(t, "Mask.key_padding")
        if pad.dim() != 2:
            raise AttentionError(
                f"Mask.key_padding expects shape (B, Lk); got {shape_str(pad.shape)}."
            )
        return cls((KeepPart(~pad[:, None, None, :]),))  # (B, 1, 1, Lk)

    @classmethod
    def causal(cls, align: str = "top_left") -> Mask:
        """Query i sees keys j <= i (top_left) or j <= i + Lk - Lq (bottom_right, for decoding)."""
        if align not in ALIGNS:
            raise AttentionError(f"Mask.causal align must be one of {ALIGNS}; got {align!r}.")
        return cls((CausalPart(align),))

    # ---------------------------------------------------------------- combination
    def __and__(self, other: Mask) -> Mask:
        if not isinstance(other, Mask):
            return NotImplemented
        return Mask(self.parts + other.parts)

    def __repr__(self) -> str:
        return "Mask(" + " & ".join(_describe(p) for p in self.parts) + ")" if self.parts else "Mask()"

    # ---------------------------------------------------------------- structure queries
    @property
    def causal_align(self) -> str | None:
        """The alignment when this mask is exactly one causal part, else None."""
        if len(self.parts) == 1 and isinstance(self.parts[0], CausalPart):
            return self.parts[0].align
        return None

    def validate(self, B: int, H: int, Lq: int, Lk: int, device: torch.device) -> None:
        """Raise AttentionError unless every part fits (B, H, Lq, Lk) on `device`."""
        target = f"(B={B}, H={H}, Lq={Lq}, Lk={Lk})"
        for part in self.parts:
            if isinstance(part, CausalPart):
                continue
            tensors = _tensors_of(part)
            for t in tensors:
                if t.device != device:
                    raise AttentionError(f"mask is on {t.device} but the inputs are on {device}.")
            if isinstance(part, LengthsPart):
                _check_lengths(part, B, Lq, Lk)
            else:
                t = tensors[0]
                if not _broadcasts(t.shape, (B, H, Lq, Lk)):
                    raise AttentionError(
                        f"mask shape {shape_str(t.shape)} cannot broadcast to {target}; "
                        "expected (..., Lq, Lk) with every dim 1 or equal to the target."
                    )

    def materialize(self, B: int, H: int, Lq: int, Lk: int, *, device=None, dtype=torch.float32):
        """Dense form: (keep, bias), each broadcastable to (B, H, Lq, Lk) or None.

        keep is bool (True = attend); bias is `dtype`, added to the scaled scores. Raises
        AttentionError when a part does not fit (B, H, Lq, Lk).
        """
        device = torch.device("cpu") if device is None else torch.device(device)
        self.validate(B, H, Lq, Lk, device)
        return self.dense(Lq, Lk, device=device, dtype=dtype)

    def dense(self, Lq: int, Lk: int, *, device=None, dtype=torch.float32):
        """`materialize` without the checks, for callers that validated already (the backends)."""
        keep = bias = None
        for part in self.parts:
            if isinstance(part, BiasPart):
                b = part.bias.to(device=device, dtype=dtype)
                bias = b if bias is None else bias + b
                continue
            k = _part_keep(part, Lq, Lk, device)
            keep = k if keep is None else keep & k
        if bias is not None and bias.is_floating_point():
            bias = bias.clamp_min(torch.finfo(bias.dtype).min)  # -1e9 in fp16 stays finite, never -inf
        return keep, bias


# -------------------------------------------------------------------- helpers
def _as_bool(t, who: str) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dtype == torch.bool:
        return t
    if t.is_complex() or not bool(((t == 0) | (t == 1)).all()):
        raise AttentionError(
            f"{who} expects a bool tensor or 0/1 values; got dtype {t.dtype} with other values. "
            "For float score offsets use Mask.additive."
        )
    return t != 0


def _as_lengths(t, name: str, ndims: tuple[int, ...]) -> torch.Tensor:
    t = torch.as_tensor(t)
    if t.dim() not in ndims:
        expected = " or ".join("(B,)" if n == 1 else "(B, Lq)" for n in ndims)
        raise AttentionError(f"{name} must have shape {expected}; got {shape_str(t.shape)}.")
    if t.is_floating_point():
        if not bool((t == t.round()).all()):
            raise AttentionError(f"{name} must hold whole numbers of positions; got fractional values.")
        t = t.long()
    elif t.dtype == torch.bool or t.is_complex():
        raise AttentionError(f"{name} must hold integer counts; got dtype {t.dtype}.")
    if t.numel() and int(t.min()) < 0:
        raise AttentionError(f"{name} must be >= 0; got a minimum of {int(t.min())}.")
    return t


def _check_lengths(part: LengthsPart, B: int, Lq: int, Lk: int) -> None:
    lens = part.key_lens
    expected = (B,) if lens.dim() == 1 else (B, Lq)
    if tuple(lens.shape) != expected:
        raise AttentionError(
            f"valid_lens shape {shape_str(lens.shape)} does not match (B={B},) or (B={B}, Lq={Lq})."
        )
    if lens.numel() and int(lens.max()) > Lk:
        raise AttentionError(f"valid_lens must be <= Lk={Lk}; got a maximum of {int(lens.max())}.")
    q = part.query_lens
    if q is not None:
        if q.shape[0] != B:
            raise AttentionError(f"query_lens shape {shape_str(q.shape)} does not match (B={B},).")
        if q.numel() and int(q.max()) > Lq:
            raise AttentionError(f"query_lens must be <= Lq={Lq}; got a maximum of {int(q.max())}.")


def _part_keep(part, Lq: int, Lk: int, device) -> torch.Tensor:
    """One part as a bool keep tensor broadcastable to (B, H, Lq, Lk)."""
    if isinstance(part, KeepPart):
        return part.keep.to(device)
    if isinstance(part, CausalPart):
        offset = 0 if part.align == "top_left" else Lk - Lq
        i = torch.arange(Lq, device=device)[:, None]
        j = torch.arange(Lk, device=device)[None, :]
        return j <= i + offset  # (Lq, Lk)
    lens = part.key_lens.to(device)
    j = torch.arange(Lk, device=device)
    if lens.dim() == 1:
        keep = (j < lens[:, None])[:, None, None, :]  # (B, 1, 1, Lk)
    else:
        keep = (j < lens[:, :, None])[:, None, :, :]  # (B, 1, Lq, Lk)
    if part.query_lens is not None:
        i = torch.arange(Lq, device=device)
        keep = keep & (i < part.query_lens.to(device)[:, None])[:, None, :, None]  # (B, 1, Lq, 1)
    return keep


def _tensors_of(part) -> list[torch.Tensor]:
    if isinstance(part, KeepPart):
        return [part.keep]
    if isinstance(part, BiasPart):
        return [part.bias]
    return [t for t in (part.key_lens, part.query_lens) if t is not None]


def _broadcasts(shape, target) -> bool:
    if len(shape) > len(target):
        return False
    return all(s in (1, t) for s, t in zip(reversed(shape), reversed(target)))


def _describe(part) -> str:
    if isinstance(part, CausalPart):
        return f"causal({part.align})"
    if isinstance(part, LengthsPart):
        q = "" if part.query_lens is None else f", query_lens{shape_str(part.query_lens.shape)}"
        return f"lengths{shape_str(part.key_lens.shape)}{q}"
    if isinstance(part, BiasPart):
        return f"additive{shape_str(part.bias.shape)}"
    return f"keep{shape_str(part.keep.shape)}"
