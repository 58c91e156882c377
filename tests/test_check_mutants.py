"""The zoo's mutants (tests/zoo_mutants.py): every correct module with one classic bug injected must get
that bug's id, and never a PASS. One mutant per id runs by default; the whole set is marked slow."""
from __future__ import annotations

import pytest

from multihead.checker import BUGS, check
from zoo_mutants import CORRECT, MUTANTS, Mutant, write_mutant

FIRST_OF_EACH_ID = list({mutant.bug: mutant for mutant in reversed(MUTANTS)}.values())


def _assert_named(tmp_path, mutant: Mutant) -> None:
    report = check(write_mutant(tmp_path, mutant), **mutant.options)
    assert report.bug == mutant.bug, str(report)
    assert report.verdict == "fail" and report.exit_code == 1


def test_every_mutant_is_a_real_edit_of_a_correct_module(tmp_path):
    assert len(MUTANTS) >= 100 and len({m.name for m in MUTANTS}) == len(MUTANTS)
    for mutant in MUTANTS:
        assert mutant.target in CORRECT
        written = write_mutant(tmp_path, mutant)  # every edit's old text occurs in the file
        assert written.endswith(":" + mutant.target.split(" ")[0].split(":")[1])


def test_mutants_cover_every_id_the_checker_can_reproduce():
    reproducible = {bug.id for bug in BUGS if bug.forms}  # forward-misspelled and wrong-scale have none
    # judged outside the forms: RoPE pairings, cached steps, an MLA module's absorbed path
    behavioural = {"rope-half-split-on-interleaved", "rope-interleaved-on-half-split", "cache-positions-not-offset",
                   "cache-causal-top-left", "mla-absorbed-wuk-transposed", "sparse-none-unmasked", "topk-wrong-axis"}
    assert reproducible | behavioural <= {m.bug for m in MUTANTS}


@pytest.mark.parametrize("mutant", FIRST_OF_EACH_ID, ids=lambda m: m.name)
def test_one_mutant_of_each_id_is_named(tmp_path, mutant):
    _assert_named(tmp_path, mutant)


@pytest.mark.slow
@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_is_named(tmp_path, mutant):
    _assert_named(tmp_path, mutant)
