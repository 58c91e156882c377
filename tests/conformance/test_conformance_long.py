"""Lengths on both sides of every dispatch threshold, against the float64 reference (slow, run in CI).

banded engages from MIN_KEYS = 2048 keys when its blocks skip at least 60% of the grid; varlen when the
padding is at least 10% of the grid and saves at least 4M multiply-adds per slice. Each case asserts
which backend "auto" picked (so a moved threshold shows) and compares values, and in grad mode the
gradients, with the 2x drift rule. Kept cheap: B=1, H=2 (one kv head: GQA), D=16.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends.banded import MIN_KEYS
from tests.conformance.cases import Case, mask_mods, score_mods
from tests.conformance.check import Expected, run_backend
from tests.conformance.reference import PartSpec, build_mask

pytestmark = pytest.mark.slow
BF16 = torch.bfloat16
F32 = torch.float32


def causal(align="top_left"):
    return PartSpec("causal", {"align": align})


def window(size, align="top_left"):
    return PartSpec("window", {"size": size, "align": align})


def lengths(*valid):
    return PartSpec("lengths", {"valid": torch.tensor(valid)})


def user_fn(kind, Lq, Lk, name):
    fns = (mask_mods if kind == "mask_mod" else score_mods)(1, 2, Lq, Lk, torch.Generator().manual_seed(0))
    return PartSpec(kind, {"fn": next(f for f in fns if f.__name__ == name)})


def segments(L, cuts):
    ids = torch.zeros(1, L, dtype=torch.long)
    for c in cuts:
        ids[:, c:] += 1
    return PartSpec("segments", {"ids": ids, "key_ids": ids})


L0 = MIN_KEYS - 1  # one key short of banded
CASES = {  # name: (Lq, Lk, specs, dtype, mode, backend auto must pick)
    "window-below-banded": (L0, L0, [window(128), causal()], F32, "grad", "sdpa"),
    "window-at-banded": (MIN_KEYS, MIN_KEYS, [window(128), causal()], F32, "grad", "banded"),
    "window-bf16-banded": (2100, 2100, [window(200), causal()], BF16, "no_grad", "banded"),
    "wide-window-declined": (MIN_KEYS, MIN_KEYS, [window(1800), causal()], F32, "no_grad", "sdpa"),
    "decode-chunk-bottom-right": (64, 2100, [window(300, "bottom_right"), causal("bottom_right")], F32, "grad",
                                  "banded"),
    "no-padding-declined": (2100, 2100, [lengths(2100)], F32, "no_grad", "sdpa"),
    "padding-varlen": (2100, 2100, [lengths(1000), causal("bottom_right")], F32, "grad", "varlen"),
    "segments-varlen": (2100, 2100, [segments(2100, (700, 1500))], BF16, "no_grad", "varlen"),
    "score-mod-banded": (2100, 2100, [user_fn("score_mod", 2100, 2100, "relative"), window(128), causal()], F32,
                         "grad", "banded"),
    "mask-mod-varlen": (2100, 2100, [user_fn("mask_mod", 2100, 2100, "band"), lengths(1200)], F32, "no_grad",
                        "varlen"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_long_lengths_match_the_reference_on_the_backend_auto_picks(name):
    Lq, Lk, specs, dtype, mode, picked = CASES[name]
    case = Case(B=1, H=2, Hkv=1, Lq=Lq, Lk=Lk, D=16, dtype=dtype, specs=specs, seed=len(name))
    q, k, v = case.inputs()
    with torch.no_grad():
        assert mh.dispatch(q, k, v, build_mask(specs)).backend == picked
    outcome = run_backend(case, "auto", mode, Expected(case, mode))
    assert outcome.status == "ok", outcome.message


def test_alibi_in_bf16_at_2048_keys_has_at_most_twice_the_reference_math_error():
    specs = [PartSpec("alibi", {"slopes": mh.alibi_slopes(8)[:2].contiguous(), "align": "top_left"}), causal()]
    case = Case(B=1, H=2, Hkv=2, Lq=2048, Lk=2048, D=16, dtype=BF16, specs=specs, seed=5)
    outcome = run_backend(case, "auto", "no_grad", Expected(case, "no_grad"))
    assert outcome.status == "ok", outcome.message
