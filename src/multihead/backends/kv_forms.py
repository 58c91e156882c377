"""The forms in which keys and values reach attention, besides plain tensors: what a cache hands to dispatch.

    "dense"      k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) tensors
    "quantized"  `Quantized` codes (B, Hkv, Lk, D) int8 or float8 e4m3 (stored as bytes) with fp32 scales
                 (B, Hkv, Lk), one per token and kv head; code * scale is the number it stands for
    "paged"      `Paged` pages (P, Hkv, S, D) read through a block table (B, n): token t of sequence b is slot
                 t % S of page table[b, t // S] (float pages, or codes with scales (P, Hkv, S))

A backend reads a form only if it declares it (capabilities.py: `kv_forms`). A form answers `shape`, `dtype`,
`device` and `requires_grad` as a tensor would, so that the checks and the plan key read it as one.

`fresh`: the float keys (or values) (B, Hkv, Lf, D) of the last Lf slots, given by the call that wrote them
(a prompt); dispatch reads a form whose every slot is fresh from these floats (with the fused kernels) and
never from its codes.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

__all__ = ["Paged", "Quantized", "dequantized", "kv_form_of", "resolved"]

PAGED_ROWS = 4  # query rows per sequence up to which a paged view is read in place (a decode step)


def dequantized(codes: torch.Tensor, scales: torch.Tensor, kv_dtype: torch.dtype,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """codes (..., D) and scales (...) -> the numbers they stand for, (..., D) in dtype."""
    if kv_dtype is torch.float8_e4m3fn:
        codes = codes.view(torch.float8_e4m3fn)
    return (codes.float() * scales[..., None]).to(dtype)


class Quantized(NamedTuple):
    """Codes (B, Hkv, L, D) with fp32 scales (B, Hkv, L) and what the codes are (int8 or float8_e4m3fn).

    split=S (a latent cache's rows [latent | rotary key]): scales (B, Hkv, L, 2), the first for the
    columns before S and the second for the rest. fresh: the float numbers of the last slots (see the
    module docstring), or None."""
    codes: torch.Tensor
    scales: torch.Tensor
    kv_dtype: torch.dtype
    split: int | None = None
    fresh: torch.Tensor | None = None

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.kv_dtype

    @property
    def device(self) -> torch.device:
        return self.codes.device

    @property
    def requires_grad(self) -> bool:
        return False  # codes carry no gradient

    def slots(self, start: int, stop: int) -> Quantized:
        """The slots start <= j < stop (views; no fresh numbers)."""
        return Quantized(self.codes[:, :, start:stop], self.scales[:, :, start:stop], self.kv_dtype, self.split)

    def numbers(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The numbers the codes stand for, (B, Hkv, L, D) in dtype."""
        if self.split is None:
            return dequantized(self.codes, self.scales, self.kv_dtype, dtype)
        S = self.split
        return torch.cat((dequantized(self.codes[..., :S], self.scales[..., 0], self.kv_dtype, dtype),
                          dequantized(self.codes[..., S:], self.scales[..., 1], self.kv_dtype, dtype)), dim=-1)

    def all_fresh(self) -> bool:
        """Whether every slot's float numbers came with the form (a prompt into an empty cache)."""
        return self.fresh is not None and self.fresh.shape[2] == self.codes.shape[2]


class Paged(NamedTuple):
    """One part (keys or values) of a paged cache: pages (P, Hkv, S, D), block_table (B, n) int32 (-1: no page),
    `length` the slots attention reads (the longest sequence's tokens), scales (P, Hkv, S) fp32 with int8 / fp8
    codes (kv_dtype says which; None: float pages)."""
    pages: torch.Tensor
    block_table: torch.Tensor
    length: int
    scales: torch.Tensor | None = None
    kv_dtype: torch.dtype | None = None

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.block_table.shape[0], self.pages.shape[1], self.length, self.pages.shape[3]))

    @property
    def dtype(self) -> torch.dtype:
        return self.pages.dtype if self.kv_dtype is None else self.kv_dtype

    @property
    def device(self) -> torch.device:
        return self.pages.device

    @property
    def requires_grad(self) -> bool:
        return False

    def numbers(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """The numbers of slots [0, length), gathered: (B, Hkv, length, D) in dtype."""
        held = self.gathered()
        return held.to(dtype) if isinstance(held, torch.Tensor) else held.numbers(dtype)

    def gathered(self):
        """The slots [0, length) of every sequence as one contiguous copy: a tensor (B, Hkv, length, D), or
        `Quantized` codes with their scales."""
        S, n = self.pages.shape[2], -(-self.length // self.pages.shape[2])
        table = self.block_table[:, :n].clamp(min=0).long()  # -1 (no page) reads page 0: masked out

        def rows(x):  # (P, Hkv, S, ...) -> (B, Hkv, n * S, ...)[:, :, :length]
            t = x[table]  # (B, n, Hkv, S, ...)
            return t.transpose(1, 2).reshape(t.shape[0], t.shape[2], n * S, *t.shape[4:])[:, :, :self.length]
        if self.kv_dtype is None:
            return rows(self.pages)
        return Quantized(rows(self.pages), rows(self.scales), self.kv_dtype)


def resolved(q: torch.Tensor, k, v):
    """k and v as dispatch reads them: a quantized form whose every slot is fresh as its float numbers; a paged
    form outside a decode step (more than PAGED_ROWS query rows, or under torch.compile) gathered."""
    if type(k) is Quantized and k.all_fresh() and type(v) is Quantized and v.all_fresh():
        return k.fresh, v.fresh
    if type(k) is Paged and type(v) is Paged and (q.shape[2] > PAGED_ROWS or torch.compiler.is_compiling()):
        return resolved(q, k.gathered(), v.gathered())
    return k, v


def kv_form_of(t) -> str:
    """"dense" for a tensor, "quantized" for `Quantized`, else the form's own `kv_form` attribute (None: unknown)."""
    if isinstance(t, torch.Tensor):
        return "dense"
    if isinstance(t, Quantized):
        return "quantized"
    if isinstance(t, Paged):
        return "paged"
    return getattr(t, "kv_form", None)
