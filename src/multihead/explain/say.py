"""Say: the words of one part of explain (a topic, a walkthrough step) in a story's language, and the blocks
that carry them. Code names each sentence by its message id; the words files hold the sentences.

    say = walkthrough_say(story, "merge")
    say.check("check.copy", ok)            # the claim, in the story's language, with its live verdict
"""
from __future__ import annotations

from typing import Any

from multihead.explain import words
from multihead.explain.story import LANGS, Story


class Say:
    """Messages `own` ({id: message}) in `story`'s language.

    `say(id, **values)` is the message `id` (else a shared "common" label) with its {placeholders} filled;
    `say.heading/text/code/check(id, ...)` add it to the story as a block.
    """

    def __init__(self, story: Story, own: dict[str, Any]):
        self.story = story
        self.own = own
        self.used: set[str] = set()   # message ids said so far (a test finds unused words with it)

    def __call__(self, key: str, **values: Any) -> str:
        if key in self.own:
            self.used.add(key)
            return words.fill(self.own[key], values)
        return words.common(self.story.lang, key, **values)

    def heading(self, key: str, **values: Any) -> None:
        self.story.add_heading(self(key, **values))

    def text(self, key: str, **values: Any) -> None:
        self.story.add_text(self(key, **values))

    def code(self, key: str, **values: Any) -> None:
        """A code block whose comments are in the story's language."""
        self.story.code(self(key, **values))

    def check(self, key: str, ok: bool, detail: str = "", **values: Any) -> bool:
        """State claim `key` with its live verdict; a false claim is recorded as failed."""
        return self.story.add_check(self(key, **values), ok, detail)


def walkthrough_say(story: Story, part: str) -> Say:
    """The words of walkthrough part `part` ("merge", "minilm", ...) in the story's language."""
    return Say(story, words.words(story.lang)["walkthrough"][part])


def both(part: str, key: str, **values: Any) -> tuple[str, str]:
    """Walkthrough message `part`/`key` filled, (English, Chinese): for texts a Setup carries in both. A value
    given as {"en": ..., "zh": ...} is taken in each language."""
    en, zh = (words.fill(words.words(lang)["walkthrough"][part][key],
                         {name: value[lang] if isinstance(value, dict) else value for name, value in values.items()})
              for lang in LANGS)
    return en, zh
