"""`multihead bench --suite latent` on tiny sizes: every row runs, the four steps agree, the cache table is right.

No timing is asserted: the numbers live in benchmarks/latent.md.
"""
from __future__ import annotations

import math

import pytest
import torch

from helpers import run_suite_quick
from multihead.bench.suites import latent

pytestmark = pytest.mark.models
pytest.importorskip("transformers")

TINY = latent.Sizes(context=24, hidden=64, heads=4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                    v_head_dim=8, gqa_kv_heads=2, dtypes=("fp32",))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    results, _, plots = run_suite_quick("latent", latent.Sizes, TINY, tmp_path_factory.mktemp("latent"))
    assert [p.name for p in plots.iterdir()] == ["latent.png"]
    return results["suites"]["latent"]


def test_five_steps_agree_and_the_target_takes_hf_at_its_fastest(data):
    steps = {r["implementation"]: r for r in data["rows"] if r["case"] == "decode step N=24 fp32"}
    assert set(steps) == {latent.ABSORBED, latent.NAIVE, *latent.HF_CALLS}
    for name in (latent.NAIVE, *latent.HF_CALLS):
        assert steps[name]["max |diff|"] < 1e-5
    assert steps[latent.HF]["MB read"] > steps[latent.ABSORBED]["MB read"]
    (target,) = data["targets"]
    assert target["goal"] == latent.GOAL_HF and math.isfinite(target["value"]) and target["value"] > 0
    fastest = min(latent.HF_CALLS, key=lambda name: steps[name]["ms"])
    assert f"HF's best: {fastest};" in target["note"]


def test_cache_bytes_per_token(data):
    table = {r["implementation"]: r for r in data["rows"] if r["case"] == "cache per token per layer, fp32"}
    D = 64 // 4
    assert table[f"MHA: 4 heads x (K {D} + V {D})"]["bytes/token"] == 2 * 4 * D * 4
    assert table[f"GQA: 2 kv heads x (K {D} + V {D})"]["bytes/token"] == 2 * 2 * D * 4
    assert table["MLA: latent 16 + rotary key 4"]["bytes/token"] == (16 + 4) * 4


def test_fill_gives_hf_and_ours_the_same_context():
    hf, rotary, mla = latent.build_pair(TINY, torch.float32)
    context = torch.randn(1, 10, 64)
    (cache, _), hf_cache = latent.fill(mla, context, headroom=2)
    x = torch.randn(1, 1, 64)
    with torch.no_grad():
        position = torch.full((1, 1), 10)
        expected = hf(x, position_embeddings=rotary(x, position), attention_mask=None, cache=hf_cache)[0]
        full = mla(torch.cat((context, x), dim=1))[:, -1:]
        torch.testing.assert_close(mla(x, cache=cache), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(full, expected, rtol=0, atol=1e-5)
