"""What `multihead check` says, in English and Chinese: a PASS states its mask's meaning first, a caller's
claim (--call mask=...) is held to, the mask is discussed only when it is in question, and no internal API
name or machine-joined list reaches a learner."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import edited_zoo_file
from multihead.checker import check
from multihead.checker.behaviour.mask_meaning import claim_broken
from multihead.checker.behaviour.mask_convention import Encoding

ZOO = Path(__file__).parent / "check_zoo"
KEEP_COMMENT = str(ZOO / "mask_one_means_keep.py:PaddingAwareAttention")


@pytest.mark.parametrize("lang, first", [
    ("en", "your mask 'mask': 1 (True) = blocked. A caller who passes 1 = keep"),
    ("zh", "你的掩码 'mask'：1（True）表示屏蔽。调用者如果传入 1 表示保留的掩码"),
])
def test_a_pass_says_first_what_its_mask_means(lang, first):
    report = check(KEEP_COMMENT, lang=lang)
    assert report.passed, str(report)
    assert report.detail_lines()[0].startswith(first)
    assert "--call mask=keep" in report.detail_lines()[0]


@pytest.mark.parametrize("lang, words", [("en", "code blocks the keys where 'mask' is 1"),
                                         ("zh", "代码屏蔽的是 'mask' 为 1 的键")])
def test_a_claimed_convention_the_module_contradicts_fails_with_a_mask_id(lang, words):
    report = check(KEEP_COMMENT, call="mask=keep", lang=lang)
    assert report.verdict == "fail" and report.bug == "mask-inverted", str(report)
    assert words in report.explanation() and "masked_fill(mask == 0" in report.explanation()


def test_a_claim_the_module_keeps_is_confirmed():
    report = check(KEEP_COMMENT, call="mask=key_padding")
    assert report.passed and report.detail_lines()[0] == "your mask 'mask' means what --call mask=key_padding says."
    other = check(str(ZOO / "ok_hf_complete_mask.py:DecoderSelfAttention"), call="mask=block")
    assert other.verdict == "fail" and other.bug is None and "--call mask=block says" in other.headline()


def test_a_complete_mask_is_recognised_and_explained():
    report = check(str(ZOO / "ok_hf_complete_mask.py:DecoderSelfAttention"), lang="zh")
    assert report.passed, str(report)
    assert "完整的掩码" in report.detail_lines()[0] and "会直接加到注意力分数上" in report.detail_lines()[0]


@pytest.mark.parametrize("lang, unwanted", [("en", "blocked keys still change"), ("zh", "被屏蔽的键仍会影响输出")])
def test_a_scale_bug_with_a_right_mask_keeps_its_mask_convention(tmp_path, lang, unwanted):
    learner = edited_zoo_file(tmp_path, "mask_one_means_keep.py", ("math.sqrt(self.d_k)", "math.sqrt(self.d_k * self.n_heads)"))
    report = check(f"{learner}:PaddingAwareAttention", lang=lang)
    assert report.bug == "scale-by-embed-dim", str(report)
    assert unwanted not in str(report)
    assert any("(B, Lk)" in line and "1" in line for line in report.convention_lines())


@pytest.mark.parametrize("lang, header", [("en", "with 4 heads of size 4, these mistakes give the same scale:"),
                                          ("zh", "在 4 个头、每头 4 维的设置下，下面几种错误得到的缩放因子相同：")])
def test_a_scale_ambiguity_is_a_short_list(tmp_path, lang, header):
    learner = edited_zoo_file(tmp_path, "mask_one_means_keep.py", ("math.sqrt(self.d_k)", "self.d_k"))
    report = check(f"{learner}:PaddingAwareAttention", lang=lang)
    notes = report.notes
    start = notes.index(header)
    items = [note for note in notes[start + 1:] if note.startswith("- ")]
    assert len(items) >= 2 and all(note.endswith(")") or note.endswith("）") for note in items)
    assert "scale-by-head-dim" in notes[-1]  # rebuilt with another head count, the one that still fits


def test_a_bug_outside_the_mask_gets_no_mask_paragraph(tmp_path):
    """A split without transpose mixes tokens, so no mask convention can be confirmed: one short line says
    so, and the notes do not discuss the mask."""
    learner = edited_zoo_file(tmp_path, "mask_one_means_keep.py",
                              (".view(b, t, self.n_heads, self.d_k).transpose(1, 2)",
                               ".view(b, self.n_heads, t, self.d_k)"))
    report = check(f"{learner}:PaddingAwareAttention")
    assert report.bug == "reshape-without-transpose", str(report)
    assert not any("mask" in note for note in report.notes), report.notes


def test_without_grouped_kv_heads_tiling_names_nothing(tmp_path):
    """A float32-only module whose mask is added with the wrong sign: no false kv-heads-tiled."""
    learner = edited_zoo_file(tmp_path, "mask_keep_sign_flipped.py",
                              ("query_layer = self.transpose_for_scores(self.query(hidden_states))",
                               "hidden_states = hidden_states.float()\n"
                               "        query_layer = self.transpose_for_scores(self.query(hidden_states))"))
    report = check(f"{learner}:PaddedSelfAttention")
    assert report.bug == "mask-sign-flipped", str(report)


def test_a_claim_without_a_mask_argument_is_noted():
    report = check(str(ZOO / "ok_fused_causal.py:Block"), call="mask=keep")
    assert report.passed and "--call mask=keep was given, but forward takes no mask argument" in report.notes


@pytest.mark.parametrize("claim, kind, family, broken", [
    ("keep", "keep", "full", None), ("keep", "block01", "key", ("mask-inverted", "1", "0")),
    ("block", "keep", "full", ("mask-inverted", "0", "1")), ("key_padding", "block", "key", None),
    ("key_padding", "block", "full", (None,)), ("additive", "keep", "full", (None,)),
    ("lengths", "lengths", "lengths", None),
])
def test_a_claim_is_held_to_the_convention_found(claim, kind, family, broken):
    got = claim_broken(claim, Encoding(kind, "(B, Lk)", family, None), "mask")
    if broken is None:
        assert got is None
    elif broken[0] is None:
        assert got[0] is None and got[1] == {"param": "mask", "claim": claim}
    else:
        assert (got[0], got[1]["blocked"], got[1]["wanted"]) == broken
