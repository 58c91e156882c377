"""The decode kernel's form of a mask: each query row's kept keys [lo, hi), and ALiBi's positions and slopes.

    key_ranges(mask, B, H, Lq, Lk, device) -> DecodeRows(lo, hi, qpos, slopes)
        lo, hi (B, Lq) int64: query i of sequence b keeps keys lo <= j < hi; qpos (B, Lq) float32: the
        query position ALiBi measures from; slopes (H,) float32 or None.

It is read from the mask's normal form (`NormalForm.row_intervals`: the interval formula on rows), so this
file never asks which kind a part is; it holds for forms that are `intervals_only` (the decode backend
refuses the others). Reads no values on the host.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from multihead.masks import Mask, NormalForm
from multihead.masks.normal_form import EMPTY


class DecodeRows(NamedTuple):
    lo: torch.Tensor  # (B, Lq) int64
    hi: torch.Tensor  # (B, Lq) int64
    qpos: torch.Tensor  # (B, Lq) float32
    slopes: torch.Tensor | None  # (H,) float32


def rows_of(form: NormalForm, B: int, H: int, Lq: int, Lk: int, device) -> DecodeRows:
    """The decode kernel's form of `form` on the (B, H, Lq, Lk) grid (see the module docstring)."""
    ix = form.index(B, H, Lq, Lk, device)
    lo, hi = form.row_intervals(ix)
    if form.slopes is None:
        return DecodeRows(lo, hi, torch.zeros(B, Lq, device=device), None)
    return DecodeRows(lo, hi, form.alibi_positions(ix), form.slopes.float().contiguous())


class RowsAtLength:
    """A plan's rows (`rows_of`) at the key length and form met last, made again for a new one (a KV cache's next
    step, a mask with new values): such a plan serves every key length and reads no value itself. p: a Problem."""

    def __init__(self, p):
        self.last = (p.dims[3], p.form, rows_of(p.form, *p.dims, p.q.device))  # replaced whole: a concurrent call
        # reads either

    def rows(self, p) -> DecodeRows:
        Lk, form, rows = self.last
        if Lk != p.k.shape[2] or form is not p.form:  # another length, or the mask's values came anew (dispatch)
            rows = rows_of(p.form, *p.dims, p.q.device)
            self.last = (p.k.shape[2], p.form, rows)
        return rows


def key_ranges(mask: Mask | None, B: int, H: int, Lq: int, Lk: int, device) -> DecodeRows:
    """`rows_of` for a mask (None: every key of every row)."""
    return rows_of(EMPTY if mask is None else mask.normal_form(), B, H, Lq, Lk, device)
