"""The walkthrough's story: every step told, every check live and passing, numbers equal to the
document's own code and to a float64 reference, and checks that do fail when their claim is false."""

from __future__ import annotations

from pathlib import Path

import torch
from helpers import max_abs_diff, reference_attention
from seeds import doc001

import multihead as mh
from multihead.explain import words
from multihead.explain.walkthrough import checks as walk_checks
from multihead.explain.walkthrough import steps as wt
from multihead.explain.say import Say
from multihead.explain.story import Story


def told(setup=None, lang="en"):
    story = Story(lang)
    return story, wt.tell(story, setup)


def headings(story):
    return [b.data["text"] for b in story.blocks if b.kind == "heading"]


def test_every_step_is_told_with_code_tensors_and_passing_checks():
    for lang in ("en", "zh"):
        story, _ = told(lang=lang)
        steps = headings(story)[1:]
        assert len(steps) == len(wt.STEPS)
        assert steps[0].startswith("Step 1 ·" if lang == "en" else "第 1 步 ·")
        assert story.failed_checks == []
        assert len(story.checks) >= len(wt.STEPS)
        kinds = {b.kind for b in story.blocks}
        assert {"code", "tensor", "text", "check", "figure", "table"} <= kinds


def test_default_input_is_document_001s():
    setup = wt.default_setup()
    assert torch.equal(setup.x[0], doc001.inputs)
    assert setup.x.shape == (1, 6, 3) and setup.tokens[0] == "Your" and setup.causal


def test_output_equals_the_documents_own_class(capsys):
    _, p = told()
    torch.manual_seed(123)
    theirs = doc001.MultiHeadAttention(3, 4, 6, 0.0, 2)(doc001.inputs[None])
    capsys.readouterr()  # the document's forward prints shapes; not ours to judge
    assert max_abs_diff(p.t["out"], theirs) < 1e-6


def test_intermediate_tensors_equal_a_float64_reference():
    _, p = told()
    m = p.setup.module
    x = p.setup.x.double()
    B, L, H, D = p.dims

    def heads(lin):  # (B, L, H*D) -> (B, H, L, D)
        w = lin.weight.double()
        b = 0 if lin.bias is None else lin.bias.double()
        return (x @ w.T + b).view(B, L, H, D).transpose(1, 2)

    q, k, v = heads(m.q_proj), heads(m.k_proj), heads(m.v_proj)
    causal_keep = torch.ones(L, L, dtype=torch.bool).tril()
    ctx = reference_attention(q, k, v, keep=causal_keep)
    assert max_abs_diff(p.t["ctx"], ctx) < 1e-6
    merged = ctx.transpose(1, 2).reshape(B, L, H * D)
    out = merged @ m.out_proj.weight.double().T + m.out_proj.bias.double()
    assert max_abs_diff(p.t["out"], out) < 1e-6
    assert not p.t["q_heads"].is_contiguous() and p.t["merged"].is_contiguous()


def test_a_false_claim_shows_up_as_a_failed_check():
    setup = wt.default_setup()
    with torch.no_grad():
        setup.module.out_proj.bias.add_(0.01)  # no longer document 001's weights
    story, _ = told(setup)
    failed = story.failed_checks
    assert len(failed) == 1 and "document 001" in failed[0]


def test_default_setup_leaves_the_global_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    wt.default_setup()
    assert torch.equal(torch.rand(3), expected)


def test_any_bidirectional_setup_passes_its_checks():
    gen = torch.Generator().manual_seed(1)
    module = mh.MultiHeadAttention(8, 4, out_dim=5).eval()
    x = torch.randn(2, 5, 8, generator=gen)
    setup = wt.Setup(x=x, module=module, tokens=list("abcde"), causal=False, input_code=("x = ...", "x = ..."),
                     about=("random", "随机"), heatmaps=False)
    story, p = told(setup)
    assert story.failed_checks == []
    assert torch.isfinite(p.t["masked"]).all()
    assert not any(b.kind == "figure" for b in story.blocks)
    assert max_abs_diff(p.t["out"], module(x)) < 1e-5


def test_head_columns_diff_is_zero_only_when_each_head_sits_in_its_own_columns():
    flat = torch.randn(2, 5, 3 * 4)  # (B, L, H*D)
    heads = flat.view(2, 5, 3, 4).transpose(1, 2)  # (B, H, L, D)
    assert walk_checks.head_columns_diff(heads, flat) == 0.0
    assert walk_checks.head_columns_diff(heads.flip(1), flat) > 0  # heads in the wrong columns
    assert walk_checks.head_columns_diff(flat.reshape(2, 3, 5, 4), flat) > 0  # the direct reshape mixes them


def test_check_close_states_the_verdict_and_the_difference():
    story = Story("zh")
    say = Say(story, {"same": "{what}相同"})
    a = torch.ones(2, 3)
    assert walk_checks.check_close(say, "same", a, a + 1e-7, what="两者")
    assert not walk_checks.check_close(say, "same", a, a + 1e-3, what="两者")
    assert not walk_checks.check_close(say, "same", a, torch.ones(3, 2), what="两者")
    assert [c.data["claim"] for c in story.checks] == ["两者相同"] * 3
    assert story.checks[1].data["detail"] == "max |diff| = 1.0e-03"
    assert story.checks[2].data["detail"] == "shapes (2, 3) vs (3, 2)"


def test_the_documents_are_named_by_title_with_a_pointer_the_first_time_they_appear():
    """`make run` used to start with "document 001's sentence" and never say what the documents are."""
    guide = (Path(__file__).parents[1] / "docs" / "textbook.md").read_text(encoding="utf-8")
    assert all(f"| {number} |" in guide for number in words.words("en")["documents"])
    for lang in ("en", "zh"):
        story = Story(lang)
        wt.tell(story)
        wt.tell_closing(story)
        texts = [b.data["text"] for b in story.blocks if b.kind == "text"]
        first = next(i for i, text in enumerate(texts) if "001" in text)
        assert "docs/textbook.md" in texts[first] and words.document(lang, "001")["title"] in texts[first]
        assert ("five documents" if lang == "en" else "五份") in texts[first]
        closing = story.blocks[-1]
        assert closing.kind == "table" and "docs/textbook.md" in closing.data["title"]
        assert [row[1] for row in closing.data["rows"]] == [d["title"] for d in words.words(lang)["documents"].values()]
