"""The 2026 held-out zoo of `multihead check` (benchmarks/check_heldout_2026/), verified without the checker.

Its figures are reported in benchmarks/check_heldout_2026-*.md, never asserted here: what is tested is that
every case is what its manifest says (correct cases equal the float64 reference; buggy ones differ and equal it
once their fix is applied), that the manifest holds what the zoo's README promises, that the harness takes
this zoo with --zoo, and that the call styles this zoo adds feed the reference what the module is fed.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
ZOO = BENCHMARKS / "check_heldout_2026"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


verify = _load("check_heldout_2026_verify", ZOO / "verify.py")
harness = _load("check_heldout_harness_2026", BENCHMARKS / "check_heldout.py")
zoo_files = sys.modules["zoo_files"]
calls = sys.modules["calls"]


def test_every_case_is_what_its_manifest_says(tmp_path, one_thread):
    cases = verify.load_manifest()
    assert len(cases) >= 70 and len({c["name"] for c in cases}) == len(cases)
    failures = [(case["name"], notes) for case in cases for ok, notes in [verify.verify(case, tmp_path)] if not ok]
    assert not failures


def test_manifest_records_what_the_readme_promises():
    cases = verify.load_manifest()
    for case in cases:
        assert {"name", "file", "target", "idiom", "source", "expected", "lang", "adapter"} <= set(case), case["name"]
        assert case["lang"] in ("EN", "ZH") and (case["expected"] == "PASS" or case.get("fix")), case["name"]
    correct = {case["file"] for case in cases if case["expected"] == "PASS"}
    assert {path.name for path in (ZOO / "cases").glob("*.py")} == correct
    assert {case["mutant_of"] for case in cases if "mutant_of" in case} <= correct
    assert sum(case["lang"] == "ZH" for case in cases) * 3 >= len(cases)  # about a third in Chinese


def test_a_mutant_is_its_sibling_with_the_fix_undone(tmp_path):
    mutants = [case for case in verify.load_manifest() if "mutant_of" in case]
    folder = zoo_files.write_cases(mutants, tmp_path, verify.CASES)
    for case in mutants:
        sibling = (verify.CASES / case["mutant_of"]).read_text(encoding="utf-8")
        assert (folder / case["file"]).read_text(encoding="utf-8") != sibling
        assert zoo_files.fixed_source(case, verify.CASES) == sibling, case["name"]


def test_harness_reads_this_zoo_with_zoo_argument():
    names = [case["name"] for case in harness.load_cases(["hunyuan_1", "chatglm_2"], zoo=ZOO)]
    assert names == ["hunyuan_1", "chatglm_2"]
    data = {"suite": ZOO.name, "totals": {"en": {"correct PASS": "1 of 1"}}, "conditions": {},
            "rows": [{"case": "hunyuan_1", "expected": "PASS", "en": {"got": "PASS", "ok": True, "seconds": 1.0}}]}
    assert "| hunyuan_1 | QK-norm (weighted RMSNorm per head) applied after RoPE" in harness.markdown(data)


def test_sequence_first_style_gives_the_reference_the_batch_first_input(one_thread):
    """A module that is the reference itself, sequence first, passes the style's comparisons exactly."""
    reference = sys.modules["reference"]
    gen = torch.Generator().manual_seed(0)
    weights = {role: (0.2 * torch.randn(32, 32, generator=gen, dtype=torch.float64), None) for role in "qkvo"}
    spec = reference.Spec(4, causal=True)

    def module(x, attention_mask=None):
        x = x.transpose(0, 1)
        if attention_mask is None:
            return reference.mha(x, x, weights, spec).transpose(0, 1)
        plain = reference.Spec(4)
        return reference.mha(x, x, weights, plain, ~attention_mask).transpose(0, 1)

    plan = sys.modules["adapters"].Plan(weights, spec, "seq_first_blocked")
    results = calls.run_calls(module, plan, gen)
    assert len(results) == 2 and all(torch.allclose(got, want, rtol=0, atol=1e-12) for _, got, want in results)
