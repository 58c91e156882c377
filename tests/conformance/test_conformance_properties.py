"""Property tests: random calls on every backend against the float64 reference, values and gradients.

Each example is one random Case (cases.py): shapes with GQA, fp32/bf16/fp16, up to three mask parts
combined with `&`, softcap and sinks, in one mode (grad, no_grad, inference_mode). Every backend runs
it; a backend that says it cannot run the call is skipped for that example (test_backends_are_covered
checks that each one does run). Failures that a known defect of the core explains (known.py) are set
aside; anything else fails with the seed that rebuilds the case: make_case(random.Random(seed)).
campaign.py runs the same check over thousands of seeds.
"""
from __future__ import annotations

import collections
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conformance.cases import DTYPES, KINDS, make_case
from tests.conformance.check import BACKENDS, MODES, check_case
from tests.conformance.known import known_defect

SEEDS = st.integers(0, 2**31 - 1)
NOT_FLEX = tuple(b for b in BACKENDS if b != "flex")


def assert_conforms(case, mode, backends=NOT_FLEX):
    outcomes = check_case(case, mode, backends)
    bad = [o for o in outcomes if o.status == "fail" and not known_defect(case, o.backend, mode, o.message)]
    assert not bad, f"{case} in {mode}:\n" + "\n".join(f"  {o.backend}: {o.message}" for o in bad)
    return outcomes


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=6, deadline=None, derandomize=True)
@given(seed=SEEDS, mode=st.sampled_from(MODES))
def test_every_kind_alone_and_combined_matches_the_reference(kind, dtype, seed, mode):
    assert_conforms(make_case(random.Random(seed), first=kind, dtypes=(dtype,)), mode)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(seed=SEEDS, mode=st.sampled_from(MODES))
def test_random_calls_match_the_reference(seed, mode):
    assert_conforms(make_case(random.Random(seed)), mode)


@settings(max_examples=6, deadline=None, derandomize=True)
@given(seed=SEEDS, mode=st.sampled_from(("no_grad", "inference_mode")))
def test_flex_matches_the_reference(seed, mode):
    """Eager flex (unfused, about 0.5 s a call on CPU; no backward there): a few examples."""
    assert_conforms(make_case(random.Random(seed), max_len=12), mode, ("flex",))


def test_backends_are_covered():
    """Over the first fixed seeds (at most 120) every backend runs (not only refuses) at least 3 times, so the
    properties test each; every case met on the way conforms."""
    ran = collections.Counter()
    for seed in range(120):
        for outcome in assert_conforms(make_case(random.Random(seed)), MODES[seed % 3]):
            ran[outcome.backend] += outcome.status == "ok"
        if seed >= 39 and all(ran[b] >= 3 for b in NOT_FLEX):
            break
    assert all(ran[b] >= 3 for b in NOT_FLEX), ran
