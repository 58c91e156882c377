"""The mask-conventions topic: one meaning in six conventions (keep, block, additive, lengths, key padding,
transformers' attention_mask), each run through mh.attention; torch's own reading of each; the classic
mix-ups shown to change the output. Its checks are live: a multihead that read key padding the other way
round fails them."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.explain import words
from multihead.explain.story import Story
from multihead.explain.topics import TOPICS

NAME = "mask-conventions"


def told(lang: str) -> Story:
    story = Story(lang)
    TOPICS[NAME].run(story)
    return story


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_six_conventions_agree_and_the_mix_ups_change_the_output(lang):
    story = told(lang)
    said = words.topic_words(lang, NAME)
    assert story.failed_checks == [] and len(story.checks) == 8
    (table,) = [b for b in story.blocks if b.kind == "table"]
    assert [row[0] for row in table.data["rows"]] == [said[f"row.{name}"] for name in
                                                       ("keep", "block", "additive", "lengths", "key-padding", "hf")]
    assert [row[3] for row in table.data["rows"]] == ["T T T F F", "F F F T T", "0 0 0 -inf -inf", "3",
                                                      "F F F T T", "1 1 1 0 0"]
    assert all(float(row[-1]) < 1e-12 for row in table.data["rows"])
    claims = [b.data["claim"] for b in story.checks]
    assert claims[-3:] == [said["check.hf-as-key-padding"], said["check.keep-as-block"], said["check.01-added"]]


def test_the_checks_are_computed_a_key_padding_read_as_keep_fails_them(monkeypatch):
    """If Mask.key_padding meant True = keep, the table's rows would disagree and passing transformers'
    attention_mask as key padding would stop being a mistake: both checks must fail."""
    as_keep = classmethod(lambda cls, t: cls.keep(torch.as_tensor(t).bool()[:, None, None, :]))
    monkeypatch.setattr(mh.Mask, "key_padding", as_keep)
    said = words.topic_words("en", NAME)
    assert told("en").failed_checks == [said["check.every-convention-same"], said["check.hf-as-key-padding"]]
