"""`multihead bench --suite quant_cache` on tiny sizes, and benchmarks/quant_drift.py on small ones: every row
runs, the drifts are measured against an fp32 cache, the targets are the issue's. No timing is asserted:
the numbers live in benchmarks/quant-cache-results.md and docs/decoding.md."""
from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
from helpers import run_suite_quick

from multihead.bench.suites import quant_cache

TINY = quant_cache.Sizes(context=96, heads=2, head_dim=32)


def test_the_suite_times_each_cache_and_measures_its_drift(tmp_path):
    results, text, _ = run_suite_quick("quant_cache", quant_cache.Sizes, TINY, tmp_path)
    data = results["suites"]["quant_cache"]
    rows = {(r["case"], r["implementation"]): r for r in data["rows"]}
    assert len(rows) == 6 and "| decode N=96: module step | int8 cache |" in text
    step = {name: rows["decode N=96: module step", name] for name in quant_cache.CACHES}
    assert step["int8 cache"]["bytes per token"] == 2 * 2 * 32 + 2 * 2 * 4 < step["bf16 cache"]["bytes per token"]
    assert 0 < step["bf16 cache"]["drift vs fp32 cache"] <= step["int8 cache"]["drift vs fp32 cache"] < 0.02
    assert step["fp8 e4m3 cache"]["drift vs fp32 cache"] < 0.1
    goals = {t["name"]: t["goal"] for t in data["targets"]}
    assert goals["decode N=96: module step, bf16 cache / int8 cache"] == 1.5
    assert goals["decode N=96: int8 cache output drift vs fp32 cache (of its largest value)"] == 0.02
    assert all(math.isfinite(t["value"]) for t in data["targets"])


def test_the_drift_script_measures_both_inputs():
    pytest.importorskip("transformers")
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "quant_drift.py"
    spec = importlib.util.spec_from_file_location("quant_drift", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for found in (script.random_drift(200), script.llama_drift(24, steps=2)):
        assert set(found) == {"bf16", "int8", "fp8"}
        assert 0 < found["bf16"] and 0 < found["int8"] < 0.03 and found["int8"] < found["fp8"] < 0.1
