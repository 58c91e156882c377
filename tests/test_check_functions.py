"""`multihead check FILE.py:function`: a plain attention function is judged like a module, with the same ids
and the same report; a function that takes its weights as arguments becomes a module whose parameters are
those weights."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import multihead as mh
from multihead.checker import check
from multihead.checker.targets.functions import function_class, weight_role
from multihead.checker.loading.learner_file import LoadError, load_class

ZOO = Path(__file__).parent / "check_zoo"


@pytest.mark.parametrize("name, role", [
    ("w_q", ("q", "weight")), ("W_K", ("k", "weight")), ("wv", ("v", "weight")), ("W_o", ("o", "weight")),
    ("q_weight", ("q", "weight")), ("out_proj_weight", ("o", "weight")), ("in_proj_weight", ("qkv", "weight")),
    ("w_qkv", ("qkv", "weight")), ("b_q", ("q", "bias")), ("value_bias", ("v", "bias")), ("x", None),
    ("mask", None), ("num_heads", None), ("query", None),
])
def test_weight_arguments_are_read_from_their_names(name, role):
    assert weight_role(name) == role


@pytest.mark.parametrize("lang, first", [
    ("en", "scaled_dot_product_attention(query, key, value, attn_mask): an attention function, taking q, k, v as "
           "(B, H, L, D)"),
    ("zh", "scaled_dot_product_attention(query, key, value, attn_mask)：一个注意力函数，q、k、v 的形状为 (B, H, L, D)"),
])
def test_an_sdpa_style_function_passes_and_the_report_speaks_of_it(lang, first):
    report = check(str(ZOO / "ok_function_sdpa_style.py:scaled_dot_product_attention"), lang=lang)
    assert report.passed and report.exit_code == 0, str(report)
    assert report.convention_lines()[0].startswith(first)
    assert report.roles == {}  # the projections around it are the checker's own, not the learner's
    assert any("True/1 = may attend" in line or "True 或 1 表示可以关注" in line for line in report.convention_lines())


def test_a_function_object_is_checked_too():
    namespace = {}
    exec((ZOO / "ok_function_assignment.py").read_text(), namespace)
    report = mh.check(namespace["attention"])
    assert report.passed and report.target == "attention", str(report)


def test_a_function_bug_gets_the_modules_id(tmp_path):
    text = (ZOO / "ok_function_assignment.py").read_text().replace("dim=-1)", "dim=-2)")
    (tmp_path / "learner.py").write_text(text)
    report = check(f"{tmp_path / 'learner.py'}:attention")
    assert report.bug == "softmax-wrong-axis" and report.exit_code == 1, str(report)


def test_a_function_with_an_argument_it_cannot_guess_is_refused_clearly(tmp_path):
    (tmp_path / "learner.py").write_text("def attend(q, k, v, temperature):\n    return q\n")
    report = check(f"{tmp_path / 'learner.py'}:attend")
    assert report.exit_code == 2 and "cannot guess the argument 'temperature' of attend()" in report.reason
    assert "无法猜出 attend() 的参数 'temperature'" in check(f"{tmp_path / 'learner.py'}:attend", lang="zh").reason


def test_a_function_that_is_not_attention_is_refused_clearly(tmp_path):
    (tmp_path / "learner.py").write_text("def helper(x):\n    return x\n")
    with pytest.raises(LoadError, match=r"helper\(\) should take queries, keys and values"):
        load_class(f"{tmp_path / 'learner.py'}:helper")


def test_weight_arguments_become_named_parameters():
    cls = load_class(str(ZOO / "ok_function_weights.py:multi_head_attention"))
    module = cls(16, 4)
    assert {name: tuple(p.shape) for name, p in module.named_parameters()} == {
        "w_q": (16, 16), "w_k": (16, 16), "w_v": (16, 16), "w_o": (16, 16)}
    x, keep = torch.randn(2, 5, 16), torch.ones(2, 5, 5, dtype=torch.bool)
    assert module(x).shape == (2, 5, 16) and torch.allclose(module(x, mask=keep), module(x))


def test_a_packed_weight_taken_as_x_at_w_gets_its_orientation():
    def mha(x, w_qkv, w_out, n_heads):
        B, L, E = x.shape
        q, k, v = (x @ w_qkv).chunk(3, dim=-1)
        q, k, v = (t.view(B, L, n_heads, -1).transpose(1, 2) for t in (q, k, v))
        out = torch.softmax(q @ k.transpose(-1, -2) / (E // n_heads) ** 0.5, -1) @ v
        return out.transpose(1, 2).reshape(B, L, E) @ w_out

    module = function_class(mha)(16, 4)
    assert module.w_qkv.shape == (16, 48) and module(torch.randn(2, 5, 16)).shape == (2, 5, 16)
