"""A new mask kind is one part class: its keep (or bias) and how it folds into the normal form. Every backend then
takes it with no change anywhere else; this file is the whole of two such kinds.

- Band(width): keys within `width` of the query on both sides, |i - j| <= width. It folds into the normal form's
  position bounds (left = right = width), so the interval kernels (decode, banded) run it natively.
- Parity(): keys of the query's parity. No slot takes it: it stays residual, evaluated densely, and the backends
  that need intervals refuse it with their reason code.
"""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import multihead as mh
from multihead.errors import CannotRunError
from multihead.masks import Index, Mask, Part
from multihead.masks.intervals import bounds, within


@dataclass(frozen=True, eq=False)
class Band(Part):
    width: int

    def keep(self, ix: Index) -> torch.Tensor:
        return within(ix.k, *bounds(ix.q, left=self.width, right=self.width))  # (.., Lq, Lk)

    def fold(self, form) -> None:
        form.positional(self, "top_left", left=self.width, right=self.width)

    def describe(self) -> str:
        return f"band({self.width})"


@dataclass(frozen=True, eq=False)
class Parity(Part):
    def keep(self, ix: Index) -> torch.Tensor:
        return (ix.q - ix.k) % 2 == 0  # (.., Lq, Lk)


def _qkv(Lq, Lk, B=2, H=4, Hkv=2, D=8):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(B, H, Lq, D, generator=g), torch.randn(B, Hkv, Lk, D, generator=g),
            torch.randn(B, Hkv, Lk, D, generator=g))


def dense_reference(q, k, v, keep):
    return mh.attention(q, k, v, Mask.keep(keep), backend="math")


@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "banded", "decode", "flex"])
def test_a_folding_kind_runs_on_every_backend_as_its_dense_keep(backend):
    Lq, Lk = (2, 80) if backend == "decode" else (9, 9)
    q, k, v = _qkv(Lq, Lk)
    mask = Mask.of(Band(2)) & Mask.lengths(torch.tensor([Lk, Lk - 3]))
    keep, _ = mask.materialize(2, 4, Lq, Lk)
    with torch.no_grad():
        torch.testing.assert_close(mh.attention(q, k, v, mask, backend=backend), dense_reference(q, k, v, keep))
    form = mask.normal_form()
    assert (form.left, form.right, form.residual) == (2, 2, ())


def test_a_kind_no_slot_takes_runs_densely_and_interval_kernels_refuse_it_with_their_code():
    q, k, v = _qkv(2, 80)
    mask = Mask.of(Parity()) & Mask.causal("bottom_right")
    keep, _ = mask.materialize(2, 4, 2, 80)
    with torch.no_grad():
        for backend in ("auto", "sdpa", "math", "flex"):
            torch.testing.assert_close(mh.attention(q, k, v, mask, backend=backend), dense_reference(q, k, v, keep))
        with pytest.raises(CannotRunError) as refused:
            mh.attention(q, k, v, mask, backend="decode")
    assert refused.value.code == "decode.mask" and "Parity" in repr(mask)
