"""multihead in Jupyter: `mh.explain(...)` gives an Explanation that Jupyter draws as the interactive
page, inline; a `capture_attention` record draws its recorded weights the same way.

    import multihead as mh
    mh.explain()                          # the walkthrough
    mh.explain("lse-merge")               # one topic
    mh.explain(text="The cat sat.", layer=2)   # all-MiniLM-L6-v2 (the 'models' extra)

The page sits in an <iframe srcdoc=...> so that its CSS and script stay apart from the notebook's;
it needs nothing from the network, like the page `multihead explain --html` writes.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from multihead.explain import words
from multihead.explain.words import ui
from multihead.explain.render.page_data import record_explorer
from multihead.terminal.language import resolve_lang
from multihead.explain.lesson import Lesson, filled, lesson
from multihead.explain.render.page import page_html, write_page

FRAME_HEIGHT = 780   # px: the model view and the head view fit; the page scrolls inside for the rest


def inline(page: str, height: int = FRAME_HEIGHT) -> str:
    """A whole page as notebook output: an iframe holding it in `srcdoc`, scripts allowed, nothing else."""
    return (f'<iframe class="multihead-explain" title="multihead explain" srcdoc="{escape(page, quote=True)}" '
            f'style="width: 100%; height: {height}px; border: 1px solid #ddd; border-radius: 4px;" '
            'sandbox="allow-scripts"></iframe>')


class Explanation:
    """What `mh.explain` returns: the lesson, its checks, and the page (inline in Jupyter, or saved)."""

    def __init__(self, told: Lesson):
        self.lesson = told
        self._page: str | None = None

    @property
    def title(self) -> str:
        return self.lesson.title[self.lesson.lang]

    @property
    def checks(self) -> list[tuple[str, bool, str]]:
        """(claim, passed, detail) for every check told, in the lesson's language."""
        return [(b.data["claim"], b.data["ok"], b.data["detail"]) for b in self.lesson.story.checks]

    @property
    def ok(self) -> bool:
        """True when every check passed."""
        return self.lesson.checks_passed

    def html(self) -> str:
        """The interactive page, as one self-contained HTML document."""
        if self._page is None:
            self._page = page_html(self.lesson)
        return self._page

    def save(self, path: str | Path) -> Path:
        """Write the page to `path` (what `multihead explain --html PATH` writes)."""
        return write_page(path, self.lesson)[0]

    def _repr_html_(self) -> str:
        return inline(self.html())

    def __repr__(self) -> str:
        """One line in the lesson's language: its title, how many checks, whether they all passed."""
        lang, failed = self.lesson.lang, len(self.lesson.story.failed_checks)
        verdict = ui("n_failed", lang, k=failed) if failed else ui("all_passed", lang)
        return ui("explanation_repr", lang, title=self.title, n=len(self.checks), verdict=verdict)


def explain(topic: str | None = None, *, text: str | None = None, layer: int = 0,
            lang: str | None = None) -> Explanation:
    """Explain multi-head attention on live tensors, as `multihead explain` does, for a notebook.

    topic: a topic name (see `multihead explain --list`); text: a sentence for all-MiniLM-L6-v2, with
    `layer` its layer (0-5, needs the 'models' extra); neither: the walkthrough. lang: "en" or "zh"
    (None: from the locale), the page's first language; its switch offers the other.
    Raises multihead.AttentionError for an unknown topic, a bad layer or an empty text.
    """
    return Explanation(lesson(topic=topic, text=text, layer=layer, lang=lang, page=True))


def record_html(record) -> str:
    """A capture_attention record as notebook output: its calls x heads in the page's views."""
    if not len(record):
        return f"<p>{escape(words.page_words(resolve_lang(None))['no_calls'])}</p>"
    title = filled("explorer_record", calls=len(record))
    told = Lesson(lang=resolve_lang(None), stories={}, title=title, explorers=[record_explorer(record, title)])
    return inline(page_html(told), height=FRAME_HEIGHT - 200)
