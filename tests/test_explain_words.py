"""The words files: English and Chinese complete and in step (same keys, same order, same placeholders),
every topic message said by its topic, and no sentence left behind in the topics' code."""
from __future__ import annotations

import collections
import re
from pathlib import Path

import pytest

from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.story import Story
from multihead.explain.topics import TOPICS, base
from multihead.terminal.phrasebook import flatten

CJK = re.compile(r"[\u4e00-\u9fff]")
TOPICS_DIR = Path(base.__file__).parent
PROSE = ("title", "question", "heading.", "text.", "check.")   # whole sentences, never code or symbols


EN, ZH = flatten(words.words("en")), flatten(words.words("zh"))


def test_both_languages_have_the_same_keys_in_the_same_order():
    assert list(EN) == list(ZH)


def message_problems(key: tuple[str, ...]) -> list[str]:
    """What is wrong with one message's pair of texts (empty, of different kinds, other placeholders)."""
    en, zh = EN[key], ZH[key]
    if not en or not zh:
        return [f"{'English' if not en else 'Chinese'} is empty"]
    if type(en) is not type(zh):
        return [f"English is a {type(en).__name__}, Chinese a {type(zh).__name__}"]
    if isinstance(en, list) and not all(isinstance(line, str) for line in en + zh):
        return ["a list holds something other than lines of text"]
    en_holes, zh_holes = collections.Counter(words.placeholders(en)), collections.Counter(words.placeholders(zh))
    if en_holes != zh_holes:
        return [f"placeholders differ: English {dict(en_holes)}, Chinese {dict(zh_holes)}"]
    return []


def test_every_message_is_filled_in_and_has_the_same_placeholders():
    """One table of every message: each failure names the message's key and what is wrong with it."""
    bad = [f"{'/'.join(key)}: {problem}" for key in EN for problem in message_problems(key)]
    assert bad == [], f"{len(bad)} of {len(EN)} messages:\n" + "\n".join(bad)


def is_prose(key: tuple[str, ...]) -> bool:
    return key[0] == "topics" and key[-1].startswith(PROSE)


def test_prose_is_english_in_english_and_chinese_in_chinese():
    """Every topic sentence (titles, questions, headings, texts, checks): each failure names the key and the text."""
    prose = [key for key in EN if is_prose(key)]
    bad = [f"{'/'.join(key)}: English holds Chinese: {EN[key]!r:.80}" for key in prose
           if CJK.search(words.template(EN[key]))]
    bad += [f"{'/'.join(key)}: Chinese has no Chinese: {ZH[key]!r:.80}" for key in prose
            if not CJK.search(words.template(ZH[key]))]
    assert prose and bad == [], f"{len(bad)} of {len(prose)} sentences:\n" + "\n".join(bad)


def test_every_topic_has_its_words_and_every_word_has_its_topic():
    assert set(words.words("en")["topics"]) == set(TOPICS)
    for name, topic in TOPICS.items():
        for lang in words.LANGS:
            assert topic.title[lang] == words.topic_words(lang, name)["title"]
            assert topic.question[lang] == words.topic_words(lang, name)["question"]


def test_every_topic_message_is_said_by_its_topic(monkeypatch):
    """No dead words: running every topic says each of its messages at least once. (English only:
    both files have the same ids, and a topic's blocks are the same in both languages.)"""
    said: dict[str, set[str]] = collections.defaultdict(set)

    class Recording(base.Say):
        def __init__(self, story, topic):
            super().__init__(story, topic)
            self.used = said[topic]

    monkeypatch.setattr(base, "Say", Recording)
    for name, topic in TOPICS.items():
        topic.run(Story("en"))
        unsaid = set(words.topic_words("en", name)) - {"title", "question"} - said[name]
        assert not unsaid, (name, sorted(unsaid))


def test_the_topics_code_holds_no_chinese():
    """Translating never means reading tensor code: every Chinese sentence lives in words/zh.json."""
    for path in sorted([*TOPICS_DIR.glob("*.py"), *(TOPICS_DIR.parent / "walkthrough").glob("*.py")]):
        found = CJK.findall(path.read_text(encoding="utf-8"))
        assert not found, f"{path.name} holds Chinese text: {''.join(found[:20])}"


def test_fill_and_placeholders():
    assert words.placeholders("{n} of {total:.2f} in {n}") == ["n", "total", "n"]
    assert words.placeholders(["a {x}", "b {{literal}}"]) == ["x"]
    assert words.fill(["x = {x}", "y"], {"x": 1}) == "x = 1\ny"
    with pytest.raises(KeyError):
        words.fill("{missing}", {})
    with pytest.raises(AttentionError, match="lang must be one of"):
        words.words("fr")


def test_say_falls_back_to_the_shared_labels_and_adds_blocks():
    story = Story("zh")
    say = base.Say(story, "memory-order")
    assert say("stride") == "步幅" and say("label.memory-order") == "内存顺序"
    say.check("check.split-result-not-contiguous", False, "detail")
    assert story.failed_checks == [words.topic_words("zh", "memory-order")["check.split-result-not-contiguous"]]
    assert story.blocks[-1].data["detail"] == "detail"


def chinese_texts() -> dict[str, str]:
    """Every Chinese text explain says: the zh words file (topics, the renderers' and the command's labels)."""
    return {"/".join(key): words.template(value) for key, value in ZH.items()}


def test_the_phrasebook_finds_the_files_in_step():
    assert words.BOOK.out_of_step() == []


STYLE = {
    "translationese (a 'little friendly correction')": re.compile(r"一点(小小|友好|温和|友善|小)?(更正|补充)|温和地"),
    "专题: the term is 主题": re.compile(r"专题"),
    "a space beside a full-width quote": re.compile(r"[\u4e00-\u9fff，。：] [“”]|[“”] [\u4e00-\u9fff，。：]"),
    "half-width punctuation after a Chinese character": re.compile(r"[\u4e00-\u9fff][,;?!](?=\s|$)|[\u4e00-\u9fff]:\s"),
}


def test_chinese_reads_as_chinese():
    """No translationese, one term per concept, full-width punctuation around Chinese words."""
    bad = [f"{rule}: {key}: {text[:60]!r}" for key, text in chinese_texts().items()
           for rule, pattern in STYLE.items() if pattern.search(text)]
    assert bad == []


def test_every_walkthrough_message_is_said(monkeypatch):
    """No dead words in the walkthrough's section: the causal default, the same without a mask, the closing
    note, every step title and (with the 'models' extra) a sentence with an [UNK] fill every message."""
    import dataclasses

    from multihead.explain.walkthrough import steps

    walkthrough = words.words("en")["walkthrough"]
    where = {id(message): (part, key) for part, own in walkthrough.items() for key, message in own.items()}
    heard: set[tuple[str, str]] = set()
    fill = words.fill

    def recording(message, values):
        heard.add(where.get(id(message), ("", "")))
        return fill(message, values)

    monkeypatch.setattr(words, "fill", recording)
    told = Story("en")
    steps.tell(told)
    headings = [block.data["text"] for block in told.blocks if block.kind == "heading"]
    heard |= {("steps", key) for key, title in walkthrough["steps"].items()
              if any(heading.endswith(f" · {title}") for heading in headings)}   # titles go in as values
    steps.tell(Story("en"), dataclasses.replace(steps.default_setup(), causal=False))
    steps.tell_closing(Story("en"))
    try:
        from multihead.explain.walkthrough import real_model

        real_model.tell_text(Story("en"), "猫 sat on the mat.", 0)
    except real_model.ModelsMissing:
        walkthrough = {part: own for part, own in walkthrough.items() if part != "minilm"}
    unsaid = sorted((part, key) for part, own in walkthrough.items() for key in own if (part, key) not in heard)
    assert unsaid == []
