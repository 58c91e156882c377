"""multihead bench --suite loops at tiny sizes: every loop measured, which backend ran recorded, tokens equal."""
from __future__ import annotations

import pytest
import torch

from multihead.bench.suites import loops, loops_attention
from multihead.bench.suites.context import Context

TINY = loops.Sizes(prompts=(96,), dtypes=("fp32",), layers=1, compiled=False, batch_requests=(2,), batch_new=2,
                   latent_prompt=96, attention=loops_attention.Sizes(keys=1024, listed=32, prefill=((128, 4),),
                                                                     prompt=96, steps=2))


@pytest.fixture(scope="module")
def result():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield loops.run(Context(rounds=1, budget_s=1.0), TINY)
    torch.set_num_threads(threads)


def test_every_loop_has_its_rows_and_the_multihead_rows_name_the_backend(result):
    by_loop = {}
    for row in result.rows:
        by_loop.setdefault(row["loop"], []).append(row)
    assert set(by_loop) == {"model decode step", "continuous batching", "DeepSeek V3 step", "sparse decode",
                            "sparse prefill", "quantized cache"}
    steps = {r["implementation"]: r for r in by_loop["model decode step"]}
    assert set(steps) == {f"{i} + {k}" for i in loops.IMPLS for k in ("dynamic", "static")}
    assert all(r["ran"] == "decode x1" for name, r in steps.items() if name.startswith("multihead"))
    assert all(r["max |diff|"] < 1e-4 for r in steps.values())  # the same step, fp32
    assert all(r["ms"] > 0 and r["x ours"] > 0 for r in result.rows)
    batching = {r["implementation"]: r for r in by_loop["continuous batching"]}
    assert "decode" in batching["multihead_flash_varlen"]["ran"]
    assert all(r["max |diff|"] is None for r in batching.values())  # None: the tokens equal paged|eager's
    sparse_rows = {r["implementation"]: r["ran"] for r in by_loop["sparse decode"]}
    assert sparse_rows == {"sparse: fresh unsorted list, cold K/V": "sparse x1", "dense step, cold K/V": "decode x1"}


def test_the_targets_are_the_issues_goals(result):
    names = [t.name for t in result.targets]
    assert sum("sdpa / multihead" in n for n in names) == 2 and any("HF's best / multihead's best" in n for n in names)
    assert any(n.startswith("continuous batching") for n in names) and any("use_latent_cache" in n for n in names)
    assert any(n.startswith("sparse prefill") for n in names) and any(n.startswith("sparse decode") for n in names)
    assert all(t.value is not None and t.value > 0 for t in result.targets)
