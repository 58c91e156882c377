"""The code a learner reads in the walkthrough and the topics: comments in the story's language, and
every line within the 80 columns (2 are the indent), so that no code line is ever wrapped; and the numbers
a check prints after its claim, each with a label that says what it is."""
from __future__ import annotations

import re
from functools import cache

import pytest
from rich.cells import cell_len

from multihead.explain.story import Story
from multihead.explain.topics import TOPICS
from multihead.explain.walkthrough.steps import DOC001_TOKENS, tell

CJK = re.compile(r"[\u4e00-\u9fff]")
# a lowercase English word that is not a name in code (not before "=", "(", "[", "." or after ".")
PROSE_WORD = re.compile(r"(?<![\w.])[a-z]{3,}(?![\w.(=\[]| \()")
SENTENCE_WORDS = {token.lower() for token in DOC001_TOKENS}   # step 1 labels its rows with them
CODE_WIDTH = 80 - 2

STORIES = ["walkthrough", *TOPICS]


@cache
def told(name: str, lang: str) -> Story:
    story = Story(lang)
    if name == "walkthrough":
        tell(story)
    else:
        TOPICS[name].run(story)
    return story


def code_lines(story: Story) -> list[str]:
    return [line for b in story.blocks if b.kind == "code" for line in b.data["source"].splitlines()]


def comments(story: Story) -> list[str]:
    return [line.split("#", 1)[1] for line in code_lines(story) if "#" in line]


@pytest.mark.parametrize("name", STORIES)
def test_chinese_code_comments_are_chinese(name):
    for comment in comments(told(name, "zh")):
        if not CJK.search(comment):
            assert set(PROSE_WORD.findall(comment)) <= SENTENCE_WORDS, f"English comment in zh: #{comment}"


@pytest.mark.parametrize("name", STORIES)
def test_english_code_comments_are_english(name):
    assert not any(CJK.search(comment) for comment in comments(told(name, "en")))


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", STORIES)
def test_code_lines_fit_without_wrapping(name, lang):
    wide = [line for line in code_lines(told(name, lang)) if cell_len(line) > CODE_WIDTH]
    assert not wide, wide


NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
NOT_A_LABEL = re.compile(r"\b(?:vs|x)\b")   # "a vs b", "4 x 512" say nothing about what the numbers are


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("name", STORIES)
def test_every_number_a_check_prints_has_a_label(name, lang):
    """`explain mla` printed [78160 > 66560 > 17824]: three numbers and no word of what they count."""
    details = [b.data["detail"] for b in told(name, lang).blocks if b.kind == "check" and b.data["detail"]]
    bare = [d for d in details if not re.search(r"[^\W\d]", NOT_A_LABEL.sub("", NUMBER.sub("", d)))]
    assert not bare, bare
