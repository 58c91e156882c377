"""`multihead check` on the five documents' code: every textbook class and every seed fixture passes as
written, except document 002's `farward` typo, which is named; the conventions found are the
documents' own."""
from __future__ import annotations

from pathlib import Path

import pytest

from multihead import textbook
from multihead.checker import check

SEEDS = Path(__file__).parent / "seeds"

TEXTBOOK = ["ReshapeTransposeHeads", "StackedHeads", "SplitHeads", "ClassicTransformerHeads",
            "SeqFirstEinsumHeads", "FoldedBatchHeads", "CausalAttention"]


@pytest.mark.parametrize("name", TEXTBOOK)
def test_textbook_class_passes(name):
    report = check(getattr(textbook, name))
    assert report.passed, str(report)
    assert report.error < 1e-6 and report.grad_error < 1e-6


@pytest.mark.parametrize("target", [
    "doc000.py:MultiHeadAttention", "doc001.py:CausalAttention", "doc001.py:MultiHeadAttentionStack",
    "doc001.py:MultiHeadAttention", "doc002.py:MultiHeadAttention", "doc003.py:MultiHeadAttention",
    "doc004.py:MultiHeadAttention",
])
def test_document_code_passes_as_written(target):
    report = check(str(SEEDS / target))
    assert report.passed, str(report)


def test_document_002_as_written_is_named_forward_misspelled():
    report = check(str(SEEDS / "doc002.py:MultiHeadAttentionAsWritten"), lang="zh")
    assert report.verdict == "fail" and report.exit_code == 1
    assert report.bug == "forward-misspelled" and report.topic == "farward-typo"
    assert "farward" in report.explanation() and "拼写错误" in report.explanation()


@pytest.mark.parametrize("target, wanted", [
    ("doc000.py:MultiHeadAttention", ["forward(hidden_state, attention_mask)", "batch first",
                                      "0/1 floats, 1 = blocked", "not causal"]),
    ("doc001.py:MultiHeadAttention", ["forward(x)", "causal inside the module", "buffer 'mask'"]),
    ("doc002.py:MultiHeadAttention", ["forward(Q, K, V, mask)", "True/1 = may attend", "Lq != Lk accepted"]),
    ("doc003.py:MultiHeadAttention", ["sequence first (L, B, E)", "(Lq, Lk, B): True/1 = may attend"]),
    ("doc004.py:MultiHeadAttention", ["forward(queries, keys, values, valid_lens)", "valid lengths"]),
    ("doc001.py:MultiHeadAttentionStack", ["4 heads of size 16"]),
])
def test_document_conventions_are_found(target, wanted):
    text = "\n".join(check(str(SEEDS / target)).convention_lines())
    for piece in wanted:
        assert piece in text, text


def test_document_001_prints_are_kept_out_of_the_report(capsys):
    report = check(str(SEEDS / "doc001.py:MultiHeadAttention"))
    assert capsys.readouterr().out == ""
    assert any("prints" in note for note in report.notes)


def test_document_004_with_different_query_key_value_sizes():
    report = check(textbook.FoldedBatchHeads, init={"key_size": 8, "query_size": 12, "value_size": 6,
                                                   "num_hiddens": 16, "num_heads": 2, "dropout": 0.0})
    assert report.passed, str(report)
    assert "Lq != Lk accepted" in report.convention_lines()


def test_document_001_with_its_own_small_sizes():
    """The document's own sizes: 3 input features, dim_out 4 (split) or 2 per head (stacked)."""
    split = check(textbook.SplitHeads, init={"dim_in": 3, "dim_out": 4, "context_length": 6,
                                             "dropout_rate": 0.0, "num_heads": 2})
    stacked = check(textbook.StackedHeads, init={"dim_in": 3, "dim_out": 2, "context_length": 6,
                                                 "dropout_rate": 0.0, "num_heads": 2})
    assert split.passed and stacked.passed
    assert "2 heads of size 2" in split.convention_lines() and "2 heads of size 2" in stacked.convention_lines()
