"""How a typed name finds its topic: itself, an English or Chinese word for it (the words files' aliases),
or "did you mean" for a near miss, plurals included."""
from __future__ import annotations

import re

import pytest

from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.topic_names import alias_topics, aliases, known_topic, near_topics, singular, spelled
from multihead.explain.topics import TOPICS

KNOWN = tuple(TOPICS)
CJK = re.compile(r"[\u4e00-\u9fff]")


def offered(name: str, lang: str = "en") -> str:
    with pytest.raises(AttentionError) as caught:
        known_topic(name, KNOWN, lang)
    return str(caught.value)


def test_every_alias_names_a_topic_and_none_is_a_topic_name():
    assert aliases() and set(words.words("en")["aliases"]) <= set(TOPICS)
    assert not set(aliases()) & set(TOPICS)
    english = [alias for said in words.words("en")["aliases"].values() for alias in said]
    chinese = [alias for said in words.words("zh")["aliases"].values() for alias in said]
    assert not [alias for alias in english if CJK.search(alias)] and all(CJK.search(alias) for alias in chinese)


def test_plurals_and_spellings_find_the_same_near_names_as_the_singular():
    assert singular("masks") == "mask" and singular("caches") == "cache" and singular("class") == "class"
    assert near_topics("masks", KNOWN) == near_topics("mask", KNOWN) == ["masked-fill", "mask-fill-value",
                                                                       "mask-asserts"]
    assert "Did you mean: masked-fill, mask-fill-value, mask-asserts?" in offered("masks")
    assert "你要找的是不是：masked-fill、mask-fill-value、mask-asserts？" in offered("Masks", "zh")
    assert spelled(" Kv Cache ") == "kv-cache" and known_topic("KV cache", KNOWN, "en") == "kv-cache"


@pytest.mark.parametrize(("word", "topic"), [("缩放", "scale-sqrt-dk"), ("因果", "masked-fill"),
                                             ("位置编码", "rope"), ("旋转位置编码", "rope"), ("KV缓存", "kv-cache"),
                                             ("scaling", "scale-sqrt-dk"), ("rotary", "rope"),
                                             ("key padding", "mask-conventions"), ("多头潜在注意力", "mla")])
def test_a_word_for_one_topic_finds_it(word, topic):
    assert known_topic(word, KNOWN, "zh") == topic


@pytest.mark.parametrize(("word", "first"), [("掩码", "mask-conventions"), ("多头", "where-heads-live"),
                                             ("注意力头", "where-heads-live"), ("缓存", "kv-cache"),
                                             ("多头注意力机制", "where-heads-live")])
def test_a_word_for_several_topics_offers_them(word, first):
    message = offered(word, "zh")
    meant = alias_topics(word)
    assert len(meant) > 1 and meant[0] == first
    assert f"“{word}”涉及好几个主题：{'、'.join(meant[:3])}。" in message
    assert f"{word!r} is a word for several topics: {', '.join(meant[:3])}." in offered(word, "en")


def test_a_name_nothing_is_close_to_lists_every_topic():
    assert "Known: " + ", ".join(KNOWN) in offered("zzzz")
