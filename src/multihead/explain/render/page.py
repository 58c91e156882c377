"""The interactive page: one self-contained HTML file that works offline and opens in any browser.

    <header>  title, EN/中文 switch
    <main>    #explorer: model view, head view, step view (drawn by page_script.SCRIPT from the data)
              the story in both languages (render_html's blocks; CSS shows the chosen one)
              the checks' summary in both languages
    <script type="application/json" id="mh-data">  explorers (render/page_data.py), page words, step titles
    <script>  page_script.SCRIPT

Inline CSS and JS only: no link, no remote script, no font or image to fetch (heatmaps are inline SVG).
"""
from __future__ import annotations

import json
from html import escape
from pathlib import Path
from typing import Any

from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.words import ui
from multihead.explain.render.page_script import SCRIPT
from multihead.explain.render.page_style import PAGE_CSS
from multihead.explain.render.html import CSS, DRAW, figure_image, summary_html
from multihead.explain.story import LANGS, Block, Story
from multihead.explain.walkthrough.steps import STEPS, step_title

MAX_BYTES = 5 * 2**20   # the page must stay mailable: 5 MB at most


def both(en: str, zh: str, tag: str = "div") -> str:
    """Two language versions of some HTML, or one when they are the same."""
    if en == zh:
        return en
    return f'<{tag} class="l-en" lang="en">{en}</{tag}><{tag} class="l-zh" lang="zh-CN">{zh}</{tag}>'


def figure_html(en: Block, zh: Block) -> str:
    """A story figure: its heatmap image once, its caption in both languages."""
    caption = both(escape(en.data["label"]), escape(zh.data["label"]), "span")
    return f"<figure>{figure_image(en, LANGS)}<figcaption>{caption}</figcaption></figure>"


def story_section(stories: dict[str, Story]) -> str:
    """Both languages' stories block by block (they have the same blocks), and their summaries."""
    if not stories:
        return ""
    parts = []
    for en, zh in zip(stories["en"].blocks, stories["zh"].blocks, strict=True):
        if en.kind == "figure":
            parts.append(figure_html(en, zh))
        else:
            parts.append(both(DRAW[en.kind](en, "en"), DRAW[zh.kind](zh, "zh")))
    summary = both(summary_html([stories["en"]], "en"), summary_html([stories["zh"]], "zh"))
    return '<section class="story">' + "\n".join(parts) + f"</section>\n{summary}"


def page_data(lesson) -> dict[str, Any]:
    """What the script needs: the explorers, the page's words and the step titles, in both languages."""
    steps = {}
    for number in range(1, len(STEPS) + 1):
        en, zh = step_title(number)
        steps[str(number)] = {"en": en, "zh": zh}
    return {"lang": lesson.lang, "title": lesson.title, "ui": {lang: words.page_words(lang) for lang in LANGS},
            "steps": steps, "explorers": lesson.explorers}


def page_html(lesson) -> str:
    """The whole page for a Lesson told in both languages (lesson.lesson(..., page=True))."""
    missing = set(LANGS) - set(lesson.stories)
    if lesson.stories and missing:
        raise AttentionError(f"the page needs the lesson in both languages; it lacks {sorted(missing)}.")
    data = json.dumps(page_data(lesson), ensure_ascii=False, separators=(",", ":")).replace("</", "<\\/")
    title = both(escape(lesson.title["en"]), escape(lesson.title["zh"]), "span")
    html_lang = "zh-CN" if lesson.lang == "zh" else "en"
    switch = ('<div class="lang-switch" role="group">'
              + "".join(f'<button type="button" data-set-lang="{lang}">{label}</button>'
                        for lang, label in (("en", "EN"), ("zh", "中文")))
              + "</div>")
    explorer = '<section id="explorer"></section>' if lesson.explorers else ""
    return (f'<!DOCTYPE html>\n<html lang="{html_lang}" data-lang="{lesson.lang}"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{escape(lesson.title[lesson.lang])}</title><style>{CSS}{PAGE_CSS}</style></head>\n"
            f'<body><header class="bar"><h1>{title}</h1>{switch}</header>\n'
            f"<main>{explorer}\n{story_section(lesson.stories)}</main>\n"
            f'<script type="application/json" id="mh-data">{data}</script>\n'
            f"<script>{SCRIPT}</script>\n</body></html>\n")


def write_page(path: str | Path, lesson) -> tuple[Path, int]:
    """Write the page to `path` (parent folders created); returns (path, size in bytes).

    AttentionError in the lesson's language, and nothing written, if the page would exceed MAX_BYTES.
    """
    html = page_html(lesson).encode("utf-8")
    if len(html) > MAX_BYTES:
        raise AttentionError(ui("page_too_large", lesson.lang, size=len(html) / 2**20, most=MAX_BYTES / 2**20))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(html)
    return path, len(html)
