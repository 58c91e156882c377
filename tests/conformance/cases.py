"""Random attention calls for the conformance suite: shapes, dtype, mask parts, softcap, sinks.

`make_case(rng)` draws one `Case` from a `random.Random`; the hypothesis tests draw the seed (so a
failure prints a seed that rebuilds the case), and campaign.py walks thousands of seeds. Every mask
kind is drawn from its raw convention (see reference.py), alone or combined with `&`.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from tests.conformance.reference import PartSpec

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
KINDS = ("keep", "block", "additive", "lengths", "lengths_per_query", "key_padding", "causal", "window", "chunks",
         "alibi", "segments", "mask_mod", "score_mod", "sparse")
ALIGNS = ("top_left", "bottom_right")


@dataclass
class Case:
    """One attention call: q (B, H, Lq, D), k and v (B, Hkv, Lk, D), the mask's parts, score variants."""

    B: int
    H: int
    Hkv: int
    Lq: int
    Lk: int
    D: int
    dtype: torch.dtype
    specs: list[PartSpec] = field(default_factory=list)
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    seed: int = 0

    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v in the case's dtype (standard normal, from the case's seed)."""
        g = torch.Generator().manual_seed(self.seed)
        shapes = ((self.B, self.H, self.Lq, self.D), (self.B, self.Hkv, self.Lk, self.D),
                  (self.B, self.Hkv, self.Lk, self.D))
        return tuple(torch.randn(s, generator=g, dtype=torch.float64).to(self.dtype) for s in shapes)

    def __repr__(self) -> str:
        extras = f", softcap={self.softcap:.3g}" if self.softcap else ""
        extras += ", sinks" if self.sinks is not None else ""
        return (f"Case(B={self.B}, H={self.H}, Hkv={self.Hkv}, Lq={self.Lq}, Lk={self.Lk}, D={self.D}, "
                f"{str(self.dtype).removeprefix('torch.')}, [{' & '.join(map(repr, self.specs))}]{extras}, "
                f"seed={self.seed})")


def make_case(rng: random.Random, *, max_len: int = 20, kinds=KINDS, dtypes=DTYPES, max_parts: int = 3,
              variants: bool = True, first: str | None = None) -> Case:
    """A random Case; lengths 1..max_len, at most max_parts mask parts (one lengths part at most).

    first: a kind the mask starts with (the others are drawn after it, in random order around it).
    """
    H = rng.choice((1, 2, 4))
    Lq = rng.randint(1, max_len)
    case = Case(B=rng.choice((1, 2, 3)), H=H, Hkv=rng.choice([d for d in (1, 2, 4) if H % d == 0]), Lq=Lq,
                Lk=Lq if rng.random() < 0.5 else rng.randint(1, max_len), D=rng.choice((4, 8, 16)),
                dtype=rng.choice(dtypes), seed=rng.getrandbits(31))
    g = torch.Generator().manual_seed(case.seed + 1)
    chosen: list[str] = []
    drawn = [rng.choice(kinds) for _ in range(rng.randint(0, max_parts))]
    if first is not None:
        drawn.insert(rng.randint(0, len(drawn)), first)
    for kind in drawn:
        if kind.startswith("lengths") and any(c.startswith("lengths") for c in chosen):
            continue
        chosen.append(kind)
        case.specs.append(make_part(kind, case, rng, g))
    if variants and rng.random() < 0.2:
        case.softcap = rng.uniform(1.0, 20.0)
    if variants and rng.random() < 0.2:
        case.sinks = torch.randn(H, generator=g)
    return case


def make_part(kind: str, c: Case, rng: random.Random, g: torch.Generator) -> PartSpec:
    """One part of `kind` fitting the case's shapes, with random raw data."""
    B, H, Lq, Lk = c.B, c.H, c.Lq, c.Lk
    if kind in ("keep", "block"):
        shape = rng.choice(((Lq, Lk), (B, 1, Lq, Lk), (1, H, Lq, Lk), (B, H, Lq, Lk), (B, 1, 1, Lk)))
        t = torch.rand(shape, generator=g) < rng.uniform(0.2, 0.9)
        return PartSpec(kind, {"t": t.long() if rng.random() < 0.2 else t})
    if kind == "additive":
        shape = rng.choice(((Lq, Lk), (B, 1, Lq, Lk), (B, H, Lq, Lk), (B, 1, 1, Lk)))
        t = 2 * torch.randn(shape, generator=g)
        t = t.masked_fill(torch.rand(shape, generator=g) < rng.choice((0.0, 0.3)), float("-inf"))
        return PartSpec(kind, {"t": t.to(rng.choice((torch.float32, c.dtype)))})
    if kind == "lengths":
        query = torch.randint(0, Lq + 1, (B,), generator=g) if rng.random() < 0.4 else None
        return PartSpec(kind, {"valid": torch.randint(0, Lk + 1, (B,), generator=g), "query": query})
    if kind == "lengths_per_query":
        return PartSpec("lengths", {"valid": torch.randint(0, Lk + 1, (B, Lq), generator=g)})
    if kind == "key_padding":
        return PartSpec(kind, {"pad": torch.rand(B, Lk, generator=g) < 0.3})
    if kind in ("causal", "window", "chunks", "alibi"):
        args = {"align": rng.choice(ALIGNS)}
        if kind in ("window", "chunks"):
            args["size"] = rng.randint(1, Lk + 1)
        if kind == "alibi":
            args["slopes"] = torch.rand(H, generator=g) * 0.5 + 0.01
        return PartSpec(kind, args)
    if kind == "segments":
        return PartSpec(kind, segment_ids(B, Lq, Lk, rng, g))
    if kind == "sparse":  # listed keys per query (per head or shared), -1 = a free slot, duplicates allowed
        K = rng.randint(1, Lk + 1)
        shape = (B, H, Lq, K) if rng.random() < 0.3 else (B, Lq, K)
        return PartSpec(kind, {"indices": torch.randint(-1, Lk, shape, generator=g)})
    if kind == "mask_mod":
        return PartSpec(kind, {"fn": rng.choice(mask_mods(B, H, Lq, Lk, g))})
    if kind == "score_mod":
        return PartSpec(kind, {"fn": rng.choice(score_mods(B, H, Lq, Lk, g))})
    raise KeyError(kind)


def segment_ids(B: int, Lq: int, Lk: int, rng: random.Random, g: torch.Generator) -> dict:
    """Packed-sequence ids: sorted runs (slices for varlen) or, sometimes, scattered ids (dense path)."""
    def runs(L):
        if rng.random() < 0.2:
            return torch.randint(0, 3, (B, L), generator=g)
        return torch.sort(torch.randint(0, 3, (B, L), generator=g), dim=-1).values

    ids = runs(Lq)
    return {"ids": ids, "key_ids": ids if Lq == Lk and rng.random() < 0.7 else runs(Lk)}


def mask_mods(B: int, H: int, Lq: int, Lk: int, g: torch.Generator):
    """FlexAttention-style mask_mods: a band, an index pattern, and a lookup of a captured bool table."""
    table = torch.rand(B, H, Lq, Lk, generator=g) < 0.6

    def band(b, h, q_idx, kv_idx):
        return (q_idx - kv_idx).abs() <= 3

    def pattern(b, h, q_idx, kv_idx):
        return (q_idx + 2 * kv_idx + b + h) % 3 != 0

    def lookup(b, h, q_idx, kv_idx):
        return table[b, h, q_idx, kv_idx]

    return band, pattern, lookup


def score_mods(B: int, H: int, Lq: int, Lk: int, g: torch.Generator):
    """FlexAttention-style score_mods: a relative-position table, a per-head scale, a soft cap with a row term."""
    table = torch.randn(H, Lq + Lk - 1, generator=g)

    def relative(score, b, h, q_idx, kv_idx):
        return score + table[h, q_idx - kv_idx + Lk - 1]

    def per_head(score, b, h, q_idx, kv_idx):
        return score * (1 + 0.25 * h)

    def squash(score, b, h, q_idx, kv_idx):
        return 4 * torch.tanh(score / 4) + 0.1 * b + 0.05 * q_idx

    return relative, per_head, squash
