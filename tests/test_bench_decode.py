"""`multihead bench --suite decode` on tiny sizes: every part runs, agrees with its baseline, reports.

No timing is asserted: the numbers live in benchmarks/decode.md. What is checked is that every row
computes the same thing as the row it is compared with, and the pieces the suite is built from.
"""
from __future__ import annotations

import math

import pytest
import torch

import multihead as mh
from multihead.bench import timing
from multihead.bench.llama_pair import LlamaPair
from multihead.bench.suites import decode
from helpers import run_suite_quick
from multihead.bench.suites.context import Context

TINY = decode.Sizes(contexts=(24,), heads=4, kv_heads=2, head_dim=16, ragged_batch=4, ragged_longest=32,
                    window=8, window_length=48, window_heads=2, window_head_dim=8, rotation_mib=1,
                    compiled_peers=False)


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """The CLI with --suite decode --quick at TINY sizes: (JSON data, Markdown text, plot directory)."""
    return run_suite_quick("decode", decode.Sizes, TINY, tmp_path_factory.mktemp("decode"))


def rows(data, case_start: str) -> dict[str, dict]:
    found = {r["implementation"]: r for r in data["suites"]["decode"]["rows"] if r["case"].startswith(case_start)}
    assert found, case_start
    return found


def test_cli_writes_every_part_with_targets_markdown_and_a_plot(bench):
    data, markdown, plots = bench
    assert set(data["suites"]) == {"decode"}
    names = [t["name"] for t in data["suites"]["decode"]["targets"]]
    for dtype in TINY.dtypes:
        assert f"decode N=24 {dtype}: attention reads K/V at this share of the read bandwidth" in names
        assert f"decode N=24 {dtype}: recompute / module step" in names
        assert f"decode N=24 {dtype}: HF LlamaAttention step at its best call / ours" in names
    assert "ragged decode 4 x 8..32: strongest dense padded call / ours" in names
    assert "window prefill N=48 W=8: dense-masked SDPA / ours" in names
    for t in data["suites"]["decode"]["targets"]:
        assert math.isfinite(t["value"]) and t["value"] > 0 and t["met"] in (True, False)
        assert t["note"].startswith("quick sizes, indicative only")
    assert "### Targets" in markdown and "load average" in markdown
    assert [p.name for p in plots.iterdir()] == ["decode.png"]


@pytest.mark.parametrize("dtype", TINY.dtypes)
def test_decode_step_rows_agree_with_hf_and_with_the_recompute(bench, dtype):
    tol = 1e-5 if dtype == "fp32" else 2e-2
    step = rows(bench[0], f"decode N=24 {dtype}: module step")
    assert set(step) == {"ours: MultiHeadAttention + KVCache", "of which: KVCache.append of one token",
                         decode.HF_DYNAMIC, decode.HF_STATIC, "ours recomputing all 25 tokens"}
    assert step["ours: MultiHeadAttention + KVCache"]["x ours"] == 1.0
    for name in (decode.HF_DYNAMIC, decode.HF_STATIC, "ours recomputing all 25 tokens"):
        assert step[name]["max |diff|"] <= tol, name
    best = next(t for t in bench[0]["suites"]["decode"]["targets"] if "HF LlamaAttention step at its best call" in t["name"]
                and f" {dtype}:" in t["name"])
    fastest = min((decode.HF_DYNAMIC, decode.HF_STATIC), key=lambda name: step[name]["ms"])
    assert f"HF's best call: {fastest};" in best["note"]
    alone = rows(bench[0], f"decode N=24 {dtype}: attention")
    assert alone["ours: mh.attention"]["runs"] == "sdpa"
    for name in ("raw SDPA, enable_gqa", "SDPA on grouped queries"):
        assert alone[name]["max |diff|"] <= tol, name
    bandwidth = next(r for name, r in alone.items() if name.startswith("read bandwidth"))
    assert bandwidth["implementation"].endswith("(this part's rounds)") and bandwidth["GB/s"] > 0


def test_every_share_divides_by_one_bandwidth_for_the_whole_run(bench):
    """The shares of all parts use the run's bandwidth: each row's GB/s over it; a part's own bandwidth
    row shows its rounds against it, and the notes name the run's bandwidth and each part's."""
    data = bench[0]["suites"]["decode"]
    attention = [r for r in data["rows"] if r["case"].endswith(": attention") and r["case"].startswith("decode N=")]
    run_rates = {r["GB/s"] / r["% of bandwidth"] * 100 for r in attention if "threads" not in r["implementation"]}
    assert max(run_rates) == pytest.approx(min(run_rates), rel=1e-9)
    [note] = [n for n in data["notes"] if n.startswith("read bandwidth: one for the whole run")]
    assert f"{min(run_rates):.1f} GB/s" in note and all(f"N=24 {dt}" in note for dt in TINY.dtypes)


def test_ragged_and_window_rows_agree_with_their_dense_baselines(bench):
    ragged = rows(bench[0], "ragged decode 4 x 8..32: attention")
    for name in ("ours: mh.attention", "ours: backend='varlen'", "ours: backend='sdpa'",
                 "dense padded: SDPA on grouped queries + key-padding mask"):
        assert ragged[name]["max |diff|"] < 1e-5, name
    assert ragged["ours: backend='varlen'"]["runs"] == "varlen"
    module = rows(bench[0], "ragged decode 4 x 8..32: module step")
    assert all(r["max |diff|"] < 1e-5 for name, r in module.items() if r["runs"] != "sdpa")
    window = rows(bench[0], "window prefill N=48 W=8")
    assert window["ours: mh.attention, Mask.window(8) & causal"]["max |diff|"] < 1e-5


def test_filled_caches_hold_what_a_prefill_writes():
    """LlamaPair.fill writes the keys and values the module's own prefill writes, in both caches."""
    pair = LlamaPair.build(32, 4, 2, 8, dtype=torch.float32, max_position=64)
    context = torch.randn(2, 10, 32, generator=torch.Generator().manual_seed(0))
    pair.fill(context, headroom=3)
    prefilled = pair.ours.new_cache(2, 13)
    with torch.no_grad():
        pair.ours(context, cache=prefilled)
    torch.testing.assert_close(pair.our_cache.keys, prefilled.keys)
    torch.testing.assert_close(pair.our_cache.values, prefilled.values)
    assert torch.equal(pair.our_cache.lengths, prefilled.lengths)
    torch.testing.assert_close(pair.hf_cache.layers[0].keys, prefilled.keys[:, :, :10])
    x = torch.randn(2, 1, 32)
    with torch.no_grad():
        torch.testing.assert_close(pair.hf_step(x), pair.ours_step(x))
        torch.testing.assert_close(pair.recompute(torch.cat([context, x], 1))[:, -1:], pair.ours(x, cache=prefilled))


@pytest.mark.parametrize("call", ["hf_static_eager_step", pytest.param("hf_static_step", marks=pytest.mark.slow)])
def test_the_static_cache_peers_compute_our_step(call):
    """HF's StaticCache step, eager and under torch.compile, gives our step, step after step (no stale slots)."""
    pair = LlamaPair.build(32, 4, 2, 8, dtype=torch.float32, max_position=64)
    pair.fill(torch.randn(1, 10, 32, generator=torch.Generator().manual_seed(0)), headroom=4)
    with torch.no_grad():
        for x in torch.randn(3, 1, 1, 32, generator=torch.Generator().manual_seed(1)):
            torch.testing.assert_close(getattr(pair, call)(x), pair.ours_step(x))


@pytest.mark.slow
def test_the_compiled_flex_peer_keeps_the_causal_window():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 256, 16, generator=g) for _ in range(3))
    flex, why = decode.compiled_flex(q, k, v, 32)
    assert flex is not None, why
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, decode.band_keep(256, 32))
    torch.testing.assert_close(flex(), expected, atol=1e-5, rtol=1e-5)


def test_the_window_part_with_compiled_peers_times_ours_compiled_on_flex():
    """With the compiled peers, the window part also times ours under torch.compile with backend='flex' and
    reports it against compiled Flex; every row agrees with the dense baseline."""
    from multihead.bench.results import SuiteResult
    from multihead.bench.suites.window_prefill import window

    sizes = decode.Sizes(contexts=(24,), window=64, window_length=640, window_heads=2, window_head_dim=16, compiled_peers=True)
    result = SuiteResult("decode", "window", [])
    window(Context(rounds=1, warmup=0, budget_s=0.0), sizes, result)
    found = {r["implementation"]: r for r in result.rows}
    assert found["ours under torch.compile, backend='flex'"]["runs"] == "flex, compiled"
    assert all(r["max |diff|"] < 1e-5 for r in found.values() if r["max |diff|"] is not None)
    names = [t.name for t in result.targets]
    assert "window prefill N=640 W=64: compiled FlexAttention (block mask) / ours compiled, backend='flex'" in names


def test_the_clock_in_use_is_named():
    before = timing.clock_name()
    try:
        assert timing.set_clock("cpu") == timing.clock_name() == "cpu"
    finally:
        timing.set_clock(before)


def test_filled_cache_holds_each_length_plus_the_step():
    lengths = torch.tensor([3, 8, 5])
    keys, values, mask = decode.filled_cache(lengths, 8, TINY, torch.float32, torch.Generator().manual_seed(0))
    assert keys.shape == values.shape == (3, TINY.kv_heads, 9, TINY.head_dim)
    keep, _ = mask.materialize(3, 1, 1, 9)
    assert torch.equal(keep[:, 0, 0].sum(-1), lengths + 1)
    assert decode.kv_bytes(keys, lengths + 1) == 2 * 19 * TINY.kv_heads * TINY.head_dim * 4


def test_rotation_spans_the_bytes_and_hands_out_each_set_in_turn():
    assert decode.copies_for(2**20, TINY) == 1 and decode.copies_for(2**18, TINY) == 4
    assert decode.copies_for(3 * 2**18, TINY) == 2
    turn = decode.Rotation(["a", "b", "c"])
    assert [turn() for _ in range(6)] == ["b", "c", "a", "b", "c", "a"]


def test_big_rounds_takes_one_round_past_the_budget_and_more_within_it():
    calls = []
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    one = decode.big_rounds(fns, Context(rounds=5, budget_s=0.0))
    assert calls == ["a", "b"] and all(len(t.samples) == 1 for t in one.values())
    calls.clear()
    five = decode.big_rounds(fns, Context(rounds=5, budget_s=60.0))
    rounds = [sorted(calls[i:i + 2]) for i in range(0, len(calls), 2)]  # each round calls both, in any order
    assert rounds == [["a", "b"]] * 5 and all(len(t.samples) == 5 for t in five.values())
    assert all(t.median_s == sorted(t.samples)[2] for t in five.values())


@pytest.mark.parametrize("N, W", [(20, 6), (5, 8), (7, 7)])
def test_the_dense_window_baseline_keeps_what_the_window_mask_keeps(N, W):
    keep = decode.band_keep(N, W)
    ours, _ = (mh.Mask.window(W) & mh.Mask.causal()).materialize(1, 1, N, N)
    assert torch.equal(ours[0, 0], keep)
    assert int(keep.sum()) == decode.band_pairs(N, W)
