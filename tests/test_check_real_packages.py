"""`multihead check` on real packages: d2l's and labml-nn's MultiHeadAttention (quoted by the documents)
and BERT's self-attention pass as they are (skipped when the packages are not installed)."""
from __future__ import annotations

from multihead.checker import check


def test_real_d2l_multi_head_attention_passes(d2l_torch):
    report = check(d2l_torch.MultiHeadAttention, init={"num_hiddens": 16, "num_heads": 4, "dropout": 0.0})
    assert report.passed, str(report)
    assert any("valid lengths" in line for line in report.convention_lines())


def test_real_labml_multi_head_attention_passes(labml_mha):
    report = check(labml_mha.MultiHeadAttention)
    assert report.passed, str(report)
    assert "sequence first (L, B, E)" in report.convention_lines()


def test_real_bert_self_attention_passes(minilm):
    _, model = minilm
    report = check(model.encoder.layer[0].attention.self)
    assert report.passed, str(report)
    assert "12 heads of size 32" in report.convention_lines()
    assert report.roles["o"] == "(none)"  # BERT's output dense lives in BertSelfOutput
