"""Recipe (docs/extending.md, "A new check id"): a bug `multihead check` names, added in this one file.

The bug: the module adds its input back to its output (a residual connection) inside the attention, where
MultiHeadAttention returns the attention alone. In the package it takes three edits in the checker's bugs/ room:
- its entry in BUGS (src/multihead/checker/bugs/catalogue.py): the id, the explain topic that teaches it, its form;
- its form, one step of `reference_variant` in the same file: `if mistake == "add-input": out = out + xq`;
- its words in src/multihead/checker/bugs/bug_words.py: BUG_TITLE and BUG_TEXT, (English, Chinese) each.
Here the fixture makes the same three changes for the test's time, the form as a wrapper around
`reference_variant`, and a learner's module with the bug is checked.
"""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import multihead as mh
from multihead.checker.bugs import bug_words, catalogue, diagnose
from multihead.checker.bugs.catalogue import Bug
from multihead.explain.topics import TOPICS

BUG = Bug("residual-inside-attention", "linear-d-model", ("add-input",))
TITLE = ("input added back inside the attention", "在注意力内部又把输入加了回去")
TEXT = ("The module returns out_proj(attention) + x: a residual connection inside the attention. "
        "MultiHeadAttention returns the attention alone; add x in the block around it.",
        "模块返回的是 out_proj(注意力) + x，也就是把残差连接写进了注意力内部。"
        "MultiHeadAttention 只返回注意力本身；x 应该在外面的块里再加上。")


def with_input_added(xq, xk, xv, weights, keep, *, mistake=None, **options):
    """`reference_variant`, and its step for the new form: the query's input added to the output."""
    out = catalogue.reference_variant(xq, xk, xv, weights, keep, mistake=mistake, **options)
    return out + xq if mistake == "add-input" else out


class AddsItsInput(nn.Module):
    """A learner's self-attention whose forward ends with `+ x`."""

    def __init__(self, d_model, num_heads):
        super().__init__()
        self.h, self.d_k = num_heads, d_model // num_heads
        self.q, self.k, self.v, self.o = (nn.Linear(d_model, d_model) for _ in range(4))

    def forward(self, x):
        B, L, E = x.shape
        q, k, v = (lin(x).view(B, L, self.h, self.d_k).transpose(1, 2) for lin in (self.q, self.k, self.v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        return self.o((weights @ v).transpose(1, 2).reshape(B, L, E)) + x


@pytest.fixture
def new_bug(monkeypatch):
    monkeypatch.setattr(catalogue, "BUGS", catalogue.BUGS + (BUG,))
    monkeypatch.setitem(catalogue.BUG_BY_ID, BUG.id, BUG)
    monkeypatch.setitem(catalogue.BUG_OF_FORM, "add-input", BUG)
    monkeypatch.setitem(bug_words.BUG_TITLE, BUG.id, TITLE)
    monkeypatch.setitem(bug_words.BUG_TEXT, BUG.id, TEXT)
    monkeypatch.setattr(diagnose, "reference_variant", with_input_added)  # the step, where the checker calls it


def test_the_checker_names_the_new_bug_in_both_languages(new_bug):
    for lang in ("en", "zh"):
        report = mh.check(AddsItsInput(16, 4), lang=lang)
        assert not report.passed and report.bug == BUG.id and report.topic == "linear-d-model"
        assert TITLE[lang == "zh"] in str(report) and TEXT[lang == "zh"] in str(report)


def test_without_its_entry_the_module_fails_with_no_name_for_the_bug():
    report = mh.check(AddsItsInput(16, 4))
    assert not report.passed and report.bug != BUG.id


def test_the_new_bug_points_to_a_topic_that_exists_and_its_words_are_in_both_languages():
    assert BUG.topic in TOPICS and all(any("\u4e00" <= c <= "\u9fff" for c in words[1]) for words in (TITLE, TEXT))
