"""`multihead check` on a learner's token-sparse attention: a function fn(q, k, v, indices) judged against
mh.attention with mh.Mask.sparse, and a top-k selection fn(index_scores, k) judged against topk over the keys."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import multihead as mh
from multihead.checker import check
from multihead.checker.targets.sparse import causal_lists, gathered, sparse_kind

ZOO = Path(__file__).parent / "check_zoo"


def test_the_kind_is_read_from_the_argument_names():
    def attend(q, k, v, topk_indices): ...
    def select(index_scores, top_k): ...
    def best(scores): ...
    def plain(q, k, v, mask=None): ...
    def two(scores, mask): ...
    assert [sparse_kind(f) for f in (attend, select, best, plain, two)] == ["attention", "topk", "topk", None, None]


def test_probe_lists_are_causal_distinct_and_leave_free_slots():
    lists = causal_lists(8, 8, torch.Generator().manual_seed(0))  # (B, Lq, K)
    rows = torch.arange(8).view(1, 8, 1)
    assert bool((lists <= rows).all()) and bool((lists[:, :3] == -1).any(-1).all())
    for row in lists.flatten(0, 1).tolist():
        real = [j for j in row if j >= 0]
        assert len(real) == len(set(real))


def test_a_gather_over_the_slots_equals_the_sparse_mask_when_keys_are_distinct():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 8, 8, generator=g, dtype=torch.float64) for _ in range(3))
    lists = torch.stack([torch.randperm(8, generator=g)[:3] for _ in range(16)]).view(2, 8, 3)
    assert torch.allclose(gathered(q, k, v, lists), mh.attention(q, k, v, mh.Mask.sparse(lists)), atol=1e-12)


@pytest.mark.parametrize("lang, meaning", [("en", "-1 is a free slot, no key at all"), ("zh", "-1 表示空位，不对应任何键")])
def test_a_correct_sparse_function_passes_and_says_what_minus_one_means(lang, meaning):
    report = check(str(ZOO / "ok_sparse_gather.py:sparse_attention"), lang=lang)
    assert report.passed and report.exit_code == 0, str(report)
    assert meaning in str(report) and "mh.Mask.sparse(indices)" in report.convention_lines()[0]


@pytest.mark.parametrize("target, bug, en, zh", [
    ("sparse_minus_one_wraps.py:sparse_attention", "sparse-none-unmasked", "-1 slots attended as real keys",
     "把 -1 空位当成了真实的键"),
    ("topk_over_queries.py:select", "topk-wrong-axis", "top-k over the wrong axis", "top-k 取错了维度"),
])
def test_each_id_is_named_in_english_and_chinese_with_its_pointer(target, bug, en, zh):
    for lang, title in (("en", en), ("zh", zh)):
        report = check(str(ZOO / target), lang=lang)
        assert report.bug == bug and report.exit_code == 1, str(report)
        assert title in report.headline() and "multihead explain sparse-attention" in str(report)


def test_a_selection_that_is_no_top_k_fails_without_an_id(tmp_path):
    (tmp_path / "learner.py").write_text("def select(scores, k):\n    return scores.topk(k, dim=-1, largest=False).indices\n")
    report = check(f"{tmp_path / 'learner.py'}:select")
    assert report.verdict == "fail" and report.bug is None and "3 best keys" in report.headline()


def test_a_sparse_function_that_raises_shows_the_line(tmp_path):
    (tmp_path / "learner.py").write_text("def attend(q, k, v, idx):\n    return q @ k\n")
    report = check(f"{tmp_path / 'learner.py'}:attend")
    assert report.exit_code == 1 and report.exception.startswith("RuntimeError") and "learner.py:2" in report.where


@pytest.mark.parametrize("lang, note", [("en", "needs as many key/value heads as query heads"),
                                        ("zh", "键/值头的数目必须与查询头相同")])
def test_a_function_that_refuses_one_shared_kv_head_passes_and_says_so(tmp_path, lang, note):
    text = (ZOO / "ok_sparse_gather.py").read_text().replace(
        "    K = indices.shape[-1]\n", "    K = indices.shape[-1]\n    assert k.shape[1] == H, 'one kv head per query head'\n")
    (tmp_path / "learner.py").write_text(text)
    report = check(f"{tmp_path / 'learner.py'}:sparse_attention", lang=lang)
    assert report.passed and note in str(report), str(report)


@pytest.mark.parametrize("target, line", [
    ("ok_sparse_gather.py:select_top_k", "on causal scores (-inf after each query) the slots it cannot fill are -1"),
    ("ok_sparse_dense_mask.py:pick_keys", "mark those slots -1"),
])
def test_a_selection_is_told_whether_it_marks_keys_scored_minus_inf(target, line):
    report = check(str(ZOO / target))
    assert report.passed and line in str(report), str(report)
