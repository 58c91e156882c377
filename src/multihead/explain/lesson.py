"""A lesson: what `multihead explain` tells for one request (the walkthrough, a topic, or a sentence
through MiniLM), as stories and, for the interactive page, explorers.

The terminal needs the story in one language; the page carries both (its language switch) and the
attention data of its views. The CLI and the notebook API (`mh.explain`) both build lessons here.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.render.page_data import figure_explorers, walkthrough_explorer
from multihead.explain.words import ui
from multihead.terminal.language import resolve_lang
from multihead.explain.walkthrough.real_model import ModelsMissing, check_text, layer_setups, tell_text
from multihead.explain.story import LANGS, Story
from multihead.explain.topic_names import known_topic
from multihead.explain.topics import TOPICS
from multihead.explain.walkthrough.steps import default_setup, tell, tell_closing


@dataclass
class Lesson:
    """Stories by language (`lang` always, both when `page` was asked) and the page's explorers."""

    lang: str
    stories: dict[str, Story]
    title: dict[str, str]
    explorers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def story(self) -> Story:
        """The story in the lesson's own language."""
        return self.stories[self.lang]

    @property
    def checks_passed(self) -> bool:
        return not self.story.failed_checks


def filled(key: str, **values: Any) -> dict[str, str]:
    """The page words' message `key` in both languages, {"en": ..., "zh": ...}."""
    return {lang: words.fill(words.words(lang)["page"][key], values) for lang in LANGS}


def told(tell, langs: tuple[str, ...]) -> dict[str, Story]:
    """{lang: story} with `tell(story)` run once per language."""
    stories = {}
    for lang in langs:
        stories[lang] = Story(lang)
        tell(stories[lang])
    return stories


def walkthrough_lesson(langs: tuple[str, ...], page: bool) -> tuple[dict[str, Story], list]:
    stories = told(lambda story: (tell(story), tell_closing(story)), langs)
    if not page:
        return stories, []
    setup = default_setup()
    H, L = setup.module.num_heads, len(setup.tokens)
    title = filled("explorer_walkthrough", heads=H, tokens=L)
    return stories, [walkthrough_explorer([setup], setup.tokens, title, query=L // 2)]   # a token with a past and a future


def text_lesson(text: str, layer: int, langs: tuple[str, ...], page: bool) -> tuple[dict[str, Story], list]:
    stories = told(lambda story: tell_text(story, text, layer), langs)
    if not page:
        return stories, []
    setups = layer_setups(text)
    title = filled("explorer_text", layers=len(setups), heads=setups[0].module.num_heads, tokens=len(setups[0].tokens))
    query = 1 if len(setups[0].tokens) > 2 else 0   # the first word after [CLS]
    return stories, [walkthrough_explorer(setups, setups[0].tokens, title, start_row=layer, query=query)]


def topic_story(name: str, lang: str) -> Story:
    """Run topic `name` into a new story; AttentionError naming the known topics if there is none."""
    topic = TOPICS[known_topic(name, tuple(TOPICS), lang)]
    story = Story(lang)
    story.add_heading(topic.title[lang])
    story.add_text(question_line(topic, lang))
    topic.run(story)
    return story


def question_line(topic, lang: str) -> str:
    """"Question from document 004 (d2l: multi-head attention): ..." or "Question: ..." for the project's own."""
    if topic.document in words.words(lang)["documents"]:
        short = words.document(lang, topic.document)["short"]
        return words.common(lang, "question_from", number=topic.document, short=short,
                            question=topic.question[lang])
    return words.common(lang, "question_own", question=topic.question[lang])


def topic_lesson(name: str, langs: tuple[str, ...], page: bool) -> tuple[dict[str, Story], list]:
    stories = {lang: topic_story(name, lang) for lang in langs}
    if not page:
        return stories, []
    return stories, figure_explorers(stories)


def lesson(topic: str | None = None, text: str | None = None, layer: int = 0, lang: str | None = None,
           page: bool = True) -> Lesson:
    """Tell a topic, a sentence through MiniLM's layer `layer`, or (neither) the walkthrough.

    lang: "en" or "zh" (None: from the locale). page=True tells it in both languages and adds the
    explorers the interactive page draws. Raises AttentionError for an unknown topic, a bad layer or
    an empty sentence, and real_model.ModelsMissing when `text` needs the 'models' extra, all said in `lang`.
    """
    lang = resolve_lang(lang)
    langs = LANGS if page else (lang,)
    if topic is not None and text is not None:
        raise AttentionError(ui("one_thing", lang, topic=repr(topic), text=repr(text)))
    if topic is not None:
        topic = known_topic(topic, tuple(TOPICS), lang)
        stories, explorers = topic_lesson(topic, langs, page)
        title = dict(TOPICS[topic].title)
    elif text is not None:
        check_text(text, lang)   # before loading the model: a bad request fails fast, with or without the extra
        try:
            stories, explorers = text_lesson(text, layer, langs, page)
        except ModelsMissing as exc:
            raise exc.speaking(lang) from exc.__cause__
        title = filled("title_text", text=text.strip())
    else:
        stories, explorers = walkthrough_lesson(langs, page)
        title = {lang_: ui("report_title", lang_) for lang_ in LANGS}
    return Lesson(lang=lang, stories=stories, title=title, explorers=explorers)
