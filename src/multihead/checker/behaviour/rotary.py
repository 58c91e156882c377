"""RoPE inside a learner's module: the rotations the checker tries on q and k, judged by behaviour.

A module that turns its queries and keys by position reproduces none of the plain variants. The checker
then tries ``Rotary`` variants: the cos/sin tables in one layout (half-split ``cat(f, f)`` as in
GPT-NeoX / Llama, or interleaved ``repeat_interleave(f, 2)`` as in GPT-J) and the quarter turn in one
layout (``multihead.positions.apply_rotary``). Equal layouts are correct RoPE (``mh.RoPE`` in that layout);
mixed ones are the pairing bugs: the pairs the turn rotates are not the pairs the tables were made for.
A ``rotary_dim`` R (found from the dataflow: each head used as [0:R] and [R:D]) turns the first R features
of each head only (partial rotary, as GPT-NeoX and Phi-3 do).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from multihead.convert.rope_bases import DEFAULT_ROPE_BASE, rope_bases
from multihead.positions import RoPE
from multihead.positions.rotary import apply_rotary

DEFAULT_BASE = DEFAULT_ROPE_BASE
# The learner's angles are often made in float32 (positions * inv_freq): at 64 positions that moves an
# angle by up to 64 * 2**-24 rad; the checker accepts this rounding, and no more, when RoPE is applied.
ROPE_TOLERANCE = 2e-5


@dataclass(frozen=True)
class Rotary:
    """One way of turning q and k: ``tables_interleaved`` is the cos/sin layout, ``turn_interleaved`` the
    quarter turn's; ``float32`` = frequencies rounded to float32 (as a float32 inv_freq buffer holds them);
    ``rotary_dim``: only that many features of each head turn (partial RoPE; None = all of them), the first
    ones, or the last ones when ``trailing`` (the ``rope-partial-wrong-features`` mistake); ``reverse``: the
    angles are -theta (a turn the other way, as nanochat writes it: still relative, a convention)."""

    base: float
    tables_interleaved: bool
    turn_interleaved: bool
    float32: bool
    rotary_dim: int | None = None  # R: only the first R features of each head turn (None: all D)
    trailing: bool = False
    reverse: bool = False

    @property
    def correct(self) -> bool:
        return self.tables_interleaved == self.turn_interleaved and not self.trailing

    @property
    def bug(self) -> str | None:
        """The catalogue id of a mixed pairing or of the wrong features turned, None for correct RoPE."""
        if self.trailing:
            return "rope-partial-wrong-features"
        if self.correct:
            return None
        return "rope-half-split-on-interleaved" if self.tables_interleaved else "rope-interleaved-on-half-split"

    def frequencies(self, head_dim: int) -> torch.Tensor:
        """(R/2,) float64: base ** (-2i / R), R = rotary_dim or D; negated for a reverse turn."""
        turned = self.rotary_dim or head_dim
        exponents = torch.arange(0, turned, 2, dtype=torch.float64) / turned
        freqs = 1.0 / self.base ** exponents
        freqs = freqs.float().double() if self.float32 else freqs
        return -freqs if self.reverse else freqs

    def turn(self, t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """t (B, H, L, D) turned to ``positions`` (L,) (its first rotary_dim features, or its last ones when
        ``trailing``); shape unchanged. RuntimeError (as any variant that cannot run on these shapes) when D
        cannot hold the turned pairs."""
        turned = self.rotary_dim or t.shape[-1]
        if turned % 2 or turned > t.shape[-1]:
            raise RuntimeError(f"RoPE turns pairs: {turned} of a head's {t.shape[-1]} features cannot turn")
        cos, sin = _tables(self, t.shape[-1], tuple(positions.tolist()), t.dtype)  # (1, L, R)
        if not self.trailing:
            return apply_rotary(t, cos, sin, self.turn_interleaved)
        kept, turning = t[..., :-turned], t[..., -turned:]
        return torch.cat((kept, apply_rotary(turning, cos, sin, self.turn_interleaved)), dim=-1)

    def module(self, head_dim: int) -> RoPE:
        """``mh.RoPE`` in this (correct) layout with these exact frequencies, for the reference module."""
        rope = RoPE(head_dim, self.base, interleaved=self.turn_interleaved, rotary_dim=self.rotary_dim)
        rope.inv_freq = self.frequencies(head_dim)  # float64: positions (float32) * inv_freq -> float64 angles
        return rope


@functools.lru_cache(maxsize=256)
def _tables(rope: Rotary, head_dim: int, positions: tuple[int, ...], dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (1, L, R) in the rotary's table layout (the checker asks for the same few many times)."""
    angles = torch.tensor(positions, dtype=torch.float64)[:, None] * rope.frequencies(head_dim)  # (L, R/2)
    table = angles.repeat_interleave(2, dim=-1) if rope.tables_interleaved else torch.cat((angles, angles), -1)
    return table.cos().to(dtype)[None], table.sin().to(dtype)[None]


def bases(module, kwargs: dict) -> tuple[float, ...]:
    """The wavelength bases to try: any named base/theta among the constructor arguments or the module's
    attributes, then 10000 (as ``from_module`` tries them)."""
    return tuple(rope_bases(module, kwargs))


def rotaries(bases_to_try: tuple[float, ...], correct: bool, rotary_dim: int | None = None,
             trailing: bool = False, reverse: bool = False) -> list[Rotary]:
    """The correct layouts (``correct``) or the mixed ones, at every base, float32 frequencies first, turning
    ``rotary_dim`` features of each head (None: all), the last ones when ``trailing``, by -theta when
    ``reverse``."""
    layouts = [(False, False), (True, True)] if correct else [(True, False), (False, True)]
    return [Rotary(base, tables, turn, float32, rotary_dim, trailing, reverse) for tables, turn in layouts
            for base in bases_to_try for float32 in (True, False)]


def rotary_dims(head_dim: int, intended: int | None) -> list[int]:
    """The partial rotary sizes R to try for heads of ``head_dim``: the one the constructor names, then half
    and a quarter of the head (even, at least 2, less than D)."""
    found = [intended] if intended else []
    found += [head_dim // 2, head_dim // 4]
    return list(dict.fromkeys(r for r in found if r and r % 2 == 0 and 2 <= r < head_dim))
