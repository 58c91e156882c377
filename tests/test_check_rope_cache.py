"""check on RoPE modules and KV caches: the rotation is judged against mh.RoPE in both pairings, a cache is
driven prompt then step by step against the module's own full forward; correct learners' modules pass."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multihead.checker import check
from multihead.checker.bugs.catalogue import reference_variant
from multihead.checker.targets.kv_cache import PROMPT, cached_variant, find_driver, run_cached
from multihead.checker.roles.assign import Weights
from multihead.checker.behaviour.rotary import DEFAULT_BASE, Rotary, bases, rotaries
from multihead.positions import RoPE

ZOO = Path(__file__).parent / "check_zoo"


def _load(name: str, cls: str):
    namespace: dict = {}
    exec(compile((ZOO / name).read_text(), name, "exec"), namespace)
    return namespace[cls]


@pytest.mark.parametrize("interleaved", [False, True])
def test_a_correct_rotary_turns_like_mh_rope(interleaved):
    q, k = torch.randn(2, 3, 7, 8, dtype=torch.float64), torch.randn(2, 1, 7, 8, dtype=torch.float64)
    positions = torch.arange(7)
    rope = Rotary(500.0, interleaved, interleaved, float32=False)
    want_q, want_k = rope.module(8)(q, k, positions)
    torch.testing.assert_close(rope.turn(q, positions), want_q, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rope.turn(k, positions), want_k, rtol=1e-12, atol=1e-12)
    assert rope.correct and rope.bug is None
    # mh.RoPE's own float32 angles stay within the checker's RoPE tolerance of the float64 ones
    torch.testing.assert_close(RoPE(8, 500.0, interleaved)(q, k, positions)[0], want_q, rtol=2e-6, atol=2e-6)


def test_mixed_pairings_are_not_rotations_and_name_their_bug():
    x = torch.randn(1, 1, 6, 8, dtype=torch.float64)
    for rope in rotaries((DEFAULT_BASE,), correct=False):
        turned = rope.turn(x, torch.arange(6))
        assert not torch.allclose(turned.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps every length
    assert {r.bug for r in rotaries((DEFAULT_BASE,), False)} == {"rope-half-split-on-interleaved",
                                                                 "rope-interleaved-on-half-split"}
    assert {r.bug for r in rotaries((DEFAULT_BASE,), True)} == {None}


def test_bases_read_named_arguments_and_attributes_then_10000():
    module = torch.nn.Module()
    module.rope_theta = 500000.0
    assert bases(module, {"base": 100}) == (100.0, 500000.0, DEFAULT_BASE)
    assert bases(torch.nn.Linear(2, 2), {"base": True}) == (DEFAULT_BASE,)


def test_find_driver_knows_three_cache_protocols_and_plain_modules_have_none():
    returned = find_driver(_load("ok_rope_kv_cache.py", "CachedRoPEAttention")(16, 4))
    assert (returned.past, returned.flag, returned.new, returned.name) == ("past_kv", "use_cache", None,
                                                                            "past_kv + use_cache")
    in_place = find_driver(_load("ok_gptj_rope_cache_object.py", "GPTJAttention")(16, 4))
    assert in_place.past == "cache" and in_place.name == "new_cache() + cache"
    kept = find_driver(_load("kv_cache_positions_from_zero.py", "StatefulRoPEAttention")(16, 4))
    assert kept.past is None and kept.name == "reset_cache() + use_cache"
    assert find_driver(torch.nn.Linear(4, 4)) is None


def test_run_cached_gives_the_full_forward_rows_of_a_correct_cached_module():
    module = _load("ok_gptj_rope_cache_object.py", "GPTJAttention")(16, 4).double()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(run_cached(module, find_driver(module), x, PROMPT), module(x))


def test_cached_variant_without_mistake_is_the_causal_reference_and_each_mistake_differs():
    gen = torch.Generator().manual_seed(0)
    make = lambda rows: (torch.randn(rows, 8, generator=gen, dtype=torch.float64), None)  # noqa: E731
    weights = Weights(make(8), make(8), make(8), make(8), num_heads=2, rope=Rotary(DEFAULT_BASE, False, False, False))
    x = torch.randn(2, 7, 8, dtype=torch.float64, generator=gen)
    full = reference_variant(x, x, x, weights, None, causal=True)
    torch.testing.assert_close(cached_variant(weights, x, PROMPT, None), full)
    for mistake in ("cache-positions-not-offset", "cache-causal-top-left"):
        wrong = cached_variant(weights, x, PROMPT, mistake)
        torch.testing.assert_close(wrong[:, :PROMPT], full[:, :PROMPT])  # the prompt itself is right
        assert not torch.allclose(wrong[:, PROMPT:], full[:, PROMPT:])


@pytest.mark.parametrize("target, layout", [("ok_rope_kv_cache.py:CachedRoPEAttention", "rope:half"),
                                            ("ok_gptj_rope_cache_object.py:GPTJAttention", "rope:interleaved"),
                                            ("ok_sdpa_mqa_cache.py:MultiQueryAttention", None)])
def test_correct_cached_modules_pass_with_their_pairing_and_cache_named(target, layout):
    report = check(str(ZOO / target))
    assert report.passed, str(report)
    keys = [key for key, _ in report.conventions]
    assert "cache" in keys and (layout in keys if layout else not any(k.startswith("rope") for k in keys))


def test_a_kept_cache_with_positions_offset_passes_and_from_zero_is_named(tmp_path):
    text = (ZOO / "kv_cache_positions_from_zero.py").read_text()
    fixed = text.replace("def rope(self, x):", "def rope(self, x, start=0):")
    fixed = fixed.replace("torch.arange(T, dtype=x.dtype)", "torch.arange(start, start + T, dtype=x.dtype)")
    fixed = fixed.replace("q, k = self.rope(q), self.rope(k)",
                          "start = self.k_cache.shape[2] if use_cache and self.k_cache is not None else 0\n"
                          "        q, k = self.rope(q, start), self.rope(k, start)")
    assert fixed.count("start") == 6
    (tmp_path / "fixed.py").write_text(fixed)
    assert check(f"{tmp_path / 'fixed.py'}:StatefulRoPEAttention").passed
    wrong = check(str(ZOO / "kv_cache_positions_from_zero.py:StatefulRoPEAttention"), lang="zh")
    assert wrong.bug == "cache-positions-not-offset" and "torch.arange(past_len, past_len + L)" in wrong.explanation()


@pytest.mark.parametrize("target, bug, code", [
    ("rope_half_split_on_interleaved.py:RotarySelfAttention", "rope-half-split-on-interleaved", "rotate_half"),
    ("rope_interleaved_on_half_split.py:PairwiseRotaryAttention", "rope-interleaved-on-half-split", "rotate_half"),
    ("kv_cache_causal_top_left.py:CachedCausalSelfAttention", "cache-causal-top-left", "tril(Lk - Lq)"),
])
def test_rope_and_cache_bugs_are_named_in_english_and_chinese(target, bug, code):
    for lang in ("en", "zh"):
        report = check(str(ZOO / target), lang=lang)
        assert report.bug == bug and code in report.explanation(), str(report)


def test_a_cache_argument_never_read_is_noted_and_the_module_still_passes():
    report = check(str(ZOO / "ok_gpt2_conv1d.py:Attention"))
    assert report.passed and ("cache:unused", {"protocol": "layer_past"}) in report.conventions


def _edited(tmp_path, old: str, new: str) -> str:
    text = (ZOO / "ok_rope_kv_cache.py").read_text()
    assert old in text
    (tmp_path / "edited.py").write_text(text.replace(old, new))
    return f"{tmp_path / 'edited.py'}:CachedRoPEAttention"


def test_a_cached_step_that_raises_fails_with_the_learners_line(tmp_path):
    target = _edited(tmp_path, "k = torch.cat([past_kv[0], k], dim=2)", "k = torch.cat([past_kv[0], k], dim=1)")
    report = check(target)
    assert report.verdict == "fail" and report.bug is None
    assert "past_kv + use_cache" in report.reason and "torch.cat([past_kv[0], k], dim=1)" in report.reason


def test_cached_rows_that_no_variant_explains_fail_from_the_first_wrong_token(tmp_path):
    target = _edited(tmp_path, "start = 0 if past_kv is None else past_kv[0].shape[2]",
                     "start = 0 if past_kv is None else past_kv[0].shape[2] + 1")
    report = check(target, lang="zh")
    assert report.verdict == "fail" and report.bug is None
    assert f"从第 {PROMPT + 1} 个词开始就不一致" in report.reason
