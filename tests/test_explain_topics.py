"""The topic registry: its contract, and every topic told in both languages with no failed check."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from multihead.explain.story import Story
from multihead.explain.topics import ORDER, TOPICS, Topic

CJK = re.compile(r"[\u4e00-\u9fff]")

# One topic per question the seed documents ask (issue 4's list, plus each document's own questions).
REQUIRED = {
    "000": {"reshape-then-transpose", "memory-order"},
    "001": {"stacked-vs-split", "view-vs-contiguous"},
    "002": {"linear-d-model", "k-transpose", "masked-fill", "mask-fill-value", "size-unpacking",
            "split-heads-transpose", "underscore-placeholder", "combine-heads", "farward-typo"},
    "003": {"einsum-scores", "mask-asserts", "scale-sqrt-dk"},
    "004": {"where-heads-live", "heads-in-batch", "head-cost", "param-count", "heads-vs-conv"},
}


def test_registry_holds_every_required_topic_in_document_order():
    assert list(TOPICS) == list(ORDER)
    for document, names in REQUIRED.items():
        assert names <= {n for n, t in TOPICS.items() if t.document == document}, document
    documents = [t.document for t in TOPICS.values()]
    assert documents == sorted(documents)


@pytest.mark.parametrize("name", list(TOPICS))
def test_topic_metadata_is_complete_and_frozen(name):
    topic = TOPICS[name]
    assert isinstance(topic, Topic) and topic.name == name
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", name)
    for field in (topic.title, topic.question):
        assert set(field) == {"en", "zh"} and all(field.values())
        assert CJK.search(field["zh"]) and not CJK.search(field["en"])
    with pytest.raises(dataclasses.FrozenInstanceError):
        topic.name = "other"  # type: ignore[misc]


def _told(name: str, lang: str) -> Story:
    story = Story(lang=lang)
    TOPICS[name].run(story)
    return story


@pytest.mark.parametrize("name", list(TOPICS))
def test_topic_passes_every_check_in_both_languages(name):
    en, zh = _told(name, "en"), _told(name, "zh")
    for story in (en, zh):
        assert story.checks, f"{name} states no checked claim"
        assert story.failed_checks == [], story.failed_checks
    # the two languages tell the same story: same blocks, same verdicts
    assert [b.kind for b in en.blocks] == [b.kind for b in zh.blocks]
    assert [b.data["ok"] for b in en.checks] == [b.data["ok"] for b in zh.checks]
    prose = lambda s: [b.data.get("text") or b.data.get("claim") for b in s.blocks  # noqa: E731
                       if b.kind in ("text", "check", "heading")]
    assert all(CJK.search(t) for t in prose(zh) if t), "untranslated Chinese text"
    assert not any(CJK.search(t) for t in prose(en) if t), "Chinese in the English story"


def test_topics_leave_the_callers_random_state_alone():
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    TOPICS["stacked-vs-split"].run(Story())
    assert torch.equal(torch.rand(3), expected)


def test_a_false_fact_shows_up_as_a_failed_check(monkeypatch):
    """The checks are wired to the computation: break the fact and the topic reports it."""
    from multihead.explain.topics import heads, layout

    monkeypatch.setattr(layout, "split_right", layout.split_wrong)
    story = Story()
    TOPICS["reshape-then-transpose"].run(story)
    assert story.failed_checks

    monkeypatch.setattr(heads, "d2l_param_counts", lambda n=16: {H: 4 * n * n * H for H in heads.HEAD_COUNTS})
    story = Story()
    TOPICS["param-count"].run(story)
    assert story.failed_checks
