"""Recipe (docs/extending.md, "A new explain topic"): a topic is one function and its words, all in this file.

In the package the function is a module of its own, src/multihead/explain/topics/weighted_average.py, with
`@topic("weighted-average")` above it (the package finds every module there by itself), and WORDS["en"] and
WORDS["zh"] go under "topics" in src/multihead/explain/words/en.json and zh.json. Here the fixture puts the
words in place for the test's time, applies the same decorator and lists the topic beside the others.
"""
from __future__ import annotations

import pytest
import torch

from helpers import plain_terminal
import multihead as mh
from multihead.cli import main
from multihead.explain import words
from multihead.explain.story import Story
from multihead.explain.topics import TOPICS
from multihead.explain.topics.base import Say, topic

NAME = "weighted-average"

WORDS = {
    "en": {
        "title": "Each output row is a weighted average of the value rows",
        "question": "What does one row of the attention output hold?",
        "text.weights": "Softmax turns each query's scores into weights that are positive and sum to 1.",
        "label.weights": "weights of head 0",
        "check.sum-to-one": "Every query's weights sum to 1",
        "check.weights-times-values": "mh.attention's output is the weights times the values",
        "check.inside-the-values": "So every output number lies between the smallest and the largest value in "
                                   "its column",
    },
    "zh": {
        "title": "输出的每一行都是值向量的加权平均",
        "question": "注意力输出的一行里装的是什么？",
        "text.weights": "softmax 把每个查询的分数变成权重：每个权重都是正数，加起来等于 1。",
        "label.weights": "第 0 个头的权重",
        "check.sum-to-one": "每个查询的权重之和都是 1",
        "check.weights-times-values": "mh.attention 的输出就是权重乘以值",
        "check.inside-the-values": "所以输出的每个数都落在同一列值的最小值和最大值之间",
    },
}


def weighted_average(story: Story, say: Say) -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=g, dtype=torch.float64) for _ in range(3))  # (B, H, L, D)
    weights = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, dim=-1)  # (B, H, Lq, Lk)
    out = mh.attention(q, k, v)  # (B, H, Lq, D)
    say.text("text.weights")
    story.tensor(say("label.weights"), weights[0, 0])
    say.check("check.sum-to-one", bool(torch.allclose(weights.sum(-1), torch.ones(1, 2, 4, dtype=torch.float64))))
    say.check("check.weights-times-values", bool(torch.allclose(out, weights @ v)))
    low, high = v.min(dim=-2, keepdim=True).values, v.max(dim=-2, keepdim=True).values  # (B, H, 1, D)
    say.check("check.inside-the-values", bool(((out >= low) & (out <= high)).all()))


@pytest.fixture
def new_topic(monkeypatch):
    for lang in words.LANGS:
        monkeypatch.setitem(words.words(lang)["topics"], NAME, WORDS[lang])
    made = topic(NAME)(weighted_average)  # what @topic("weighted-average") does in the package
    monkeypatch.setitem(TOPICS, NAME, made)
    return made


def test_the_topic_runs_in_both_languages_and_every_claim_holds(new_topic):
    told = {}
    for lang in words.LANGS:
        story = Story(lang)
        new_topic.run(story)
        assert len(story.checks) == 3 and story.failed_checks == []
        told[lang] = [block.data["claim"] for block in story.checks]
    assert told["en"][0] == WORDS["en"]["check.sum-to-one"] and told["zh"][0] == WORDS["zh"]["check.sum-to-one"]
    assert new_topic.title == {lang: WORDS[lang]["title"] for lang in words.LANGS}


def test_the_topic_is_found_by_name_by_the_command_and_the_notebook(new_topic, capsys, monkeypatch):
    plain_terminal(monkeypatch, columns=120)
    assert main(["explain", NAME, "--lang", "zh"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].startswith(WORDS["zh"]["title"]) and "✓ " + WORDS["zh"]["check.inside-the-values"] in printed
    shown = mh.explain(NAME, lang="en")
    assert shown.ok and len(shown.checks) == 3


def test_the_words_of_both_languages_have_the_same_ids():
    assert WORDS["en"].keys() == WORDS["zh"].keys()
    assert NAME not in TOPICS  # nothing stays behind once a test is over
