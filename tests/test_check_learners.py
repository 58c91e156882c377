"""`multihead check` tells a learner the truth: an exception under a mask leads the report, the mask
convention described is the one found, a sign-flipped mask fails, real idioms (a required mask, weights
handed to F.multi_head_attention_forward, an approximation exact only on short inputs) are judged right,
and the pointer to `multihead explain TOPIC` names a topic that exists."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from multihead.checker import BUGS, check
from multihead.checker.bugs.sentences import BUG_TITLE, bug_name
from multihead.explain.topics import TOPICS

ROOT = Path(__file__).parent.parent
ZOO = ROOT / "tests" / "check_zoo"
SEEDS = ROOT / "tests" / "seeds"


def test_an_exception_under_a_mask_leads_the_report():
    report = check(str(ZOO / "raises_mask_fill_typo.py:TypoMaskAttention"))
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.headline().endswith("raises AttributeError: 'Tensor' object has no attribute 'mask_fill'")
    assert report.detail_lines()[0] == ("raised at raises_mask_fill_typo.py:24: "
                                        "attn_scores = attn_scores.mask_fill(mask == 0, -1e9)")
    assert "did you mean 'masked_fill'?" in report.detail_lines()[1]
    assert "could not be verified" not in str(report)


@pytest.mark.parametrize("edit, bug", [
    (("x.reshape(batch_size, -1, self.num_heads, self.head_dim).transpose(1, 2)",
      "x.reshape(batch_size, self.num_heads, -1, self.head_dim)"), "reshape-without-transpose"),
    (("output.transpose(1, 2).reshape(", "output.reshape("), "merge-without-transpose"),
    (("torch.softmax(attention_scores, dim=-1)", "torch.softmax(attention_scores, dim=-2)"), "softmax-wrong-axis"),
])
def test_the_mask_convention_described_is_the_one_found(tmp_path, edit, bug):
    """Document 000 with a layout bug: its 0/1 mask, 1 = blocked, is described as such, and a module
    without a causal mask is never asked about causal fills."""
    text = (SEEDS / "doc000.py").read_text()
    assert edit[0] in text
    (tmp_path / "learner.py").write_text(text.replace(edit[0], edit[1]))
    report = check(f"{tmp_path / 'learner.py'}:MultiHeadAttention")
    assert report.bug == bug, str(report)
    assert "mask 'attention_mask' (B, 1, Lq, Lk): 0/1 floats, 1 = blocked" in report.convention_lines()
    assert "causal" not in " ".join(report.notes) and "-inf = blocked" not in str(report)


def test_a_sign_flipped_mask_fails_and_says_what_a_caller_would_pass():
    report = check(str(ZOO / "mask_sign_flipped.py:FlippedSignAttention"))
    assert report.bug == "mask-sign-flipped" and report.exit_code == 1
    assert "only come out right when the caller passes the reverse mask" in report.explanation()
    assert any("fits only as 1 = may attend, added to the scores times +1e9" in line
               for line in report.convention_lines())


def test_document_000_as_written_still_passes_with_its_own_convention():
    report = check(str(SEEDS / "doc000.py:MultiHeadAttention"))
    assert report.passed and "mask 'attention_mask' (B, 1, Lq, Lk): 0/1 floats, 1 = blocked" in \
        report.convention_lines()


def test_a_required_mask_passes_with_an_all_keep_mask():
    report = check(str(ZOO / "ok_required_padding_mask.py:PaddedEncoderAttention"))
    assert report.passed, str(report)
    assert "mask 'attention_mask' (B, Lk): True/1 = may attend" in report.convention_lines()


def test_roles_are_read_from_the_functional_attention_call():
    report = check(str(ZOO / "ok_functional_mha_weights.py:FunctionalWeightsAttention"))
    assert report.passed, str(report)
    assert report.roles == {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}


def test_an_approximation_exact_only_on_short_inputs_fails():
    report = check(str(ZOO / "short_range_only.py:LocalWhenLongAttention"))
    assert report.verdict == "fail" and report.exit_code == 1
    assert "up to 12 tokens but not on 16 tokens" in report.headline()
    longer = check(str(ZOO / "short_range_only.py:LocalWhenLongAttention"), init={"d_model": 16, "num_heads": 4,
                                                                                  "full_up_to": 63})
    assert "not on 64 tokens" in longer.headline()  # probed up to 64 tokens


def test_every_bug_has_a_title_in_both_languages():
    assert set(BUG_TITLE) == {bug.id for bug in BUGS}
    assert bug_name("reshape-without-transpose", "zh") == "拆分多头时缺少 transpose（reshape-without-transpose）"
    assert bug_name("reshape-without-transpose", "en") == "heads split without a transpose (reshape-without-transpose)"


def test_every_explain_pointer_names_a_registered_topic():
    """Reports, README and docs/check.md point at `multihead explain TOPIC` (no --topic), TOPIC registered."""
    for bug in BUGS:
        assert bug.topic in TOPICS, bug
    for path in (ROOT / "README.md", ROOT / "docs" / "check.md"):
        pointers = re.findall(r"(?:learn more: |详细讲解：)multihead explain ([\w-]+)", path.read_text())
        assert pointers, path
        assert set(pointers) <= set(TOPICS), path


def test_grouped_kv_heads_copied_per_group_pass_and_tiled_ones_are_named(tmp_path):
    text = (ZOO / "gqa_kv_tiled.py").read_text()
    grouped = text
    for t in "kv":  # each kv head copied for its own group of neighbouring query heads
        grouped = grouped.replace(f"{t}[:, None].expand(B, group, self.h_kv, L, self.d)",
                                  f"{t}[:, :, None].expand(B, self.h_kv, group, L, self.d)")
    assert grouped.count("[:, :, None]") == 2
    (tmp_path / "grouped.py").write_text(grouped)
    report = check(f"{tmp_path / 'grouped.py'}:SharedKVAttention")
    assert report.passed, str(report)
    tiled = check(str(ZOO / "gqa_kv_tiled.py:SharedKVAttention"), lang="zh")
    assert tiled.bug == "kv-heads-tiled" and "repeat_interleave(H // Hkv, dim=1)" in tiled.explanation()
