"""The interactive page in a real browser: Debian's headless Chromium driven by Playwright's Python
package (launched with that executable; Playwright never downloads a browser here).

Each action (click a head, hover a token, switch the language) is checked in the DOM, and a
screenshot before and after it must differ; the page logs no console error; and the time from
navigation to interactive is measured in the browser on 6 layers x 12 heads x 16 tokens.
Skipped cleanly when chromium or playwright is missing.
"""
from __future__ import annotations

import functools
import shutil
import statistics

import pytest
import torch

import multihead as mh
from multihead.explain.render import page
from multihead.explain.render.page_data import walkthrough_explorer
from multihead.explain.lesson import Lesson, filled, lesson, told
from multihead.explain.walkthrough.steps import Setup, tell

pytestmark = [pytest.mark.browser, pytest.mark.slow]

READY = "document.documentElement.dataset.ready === 'true'"
LOADS = 5              # page loads timed for load-to-interactive; the median is reported
INTERACTIVE_MS = 1000  # issue 13: at most 1 s for 6 x 12 heads on 16 tokens, on this machine


@pytest.fixture(scope="module")
def browser():
    chromium = shutil.which("chromium")
    if chromium is None:
        pytest.skip("Debian's chromium is not installed (scripts/install-test-deps.sh installs it in CI)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="the playwright package is not installed")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def open_page(browser, tmp_path):
    """open_page(html) -> (page, errors): the page loaded from a file and (ready=True) interactive;
    errors collects every console error and uncaught exception."""
    opened = []

    def load(html: str, width: int = 1200, height: int = 1400, ready: bool = True):
        path = tmp_path / f"page{len(opened)}.html"
        path.write_text(html, encoding="utf-8")
        tab = browser.new_page(viewport={"width": width, "height": height})
        errors: list[str] = []
        tab.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
        tab.on("pageerror", lambda exc: errors.append(str(exc)))
        tab.goto(path.as_uri())
        if ready:
            tab.wait_for_function(READY, timeout=20_000)
        opened.append(tab)
        return tab, errors

    yield load
    for tab in opened:
        tab.close()


@functools.cache
def big_page() -> tuple[str, str]:
    """(page, source): a 6-layer x 12-head page on 16 tokens. all-MiniLM-L6-v2 through --text when it
    is installed; else six random 384-wide, 12-head layers of the same sizes (the same data volume)."""
    try:
        from test_explain_page import minilm_page_html

        from multihead.explain.walkthrough.real_model import ModelsMissing

        return minilm_page_html(), "all-MiniLM-L6-v2"
    except (ImportError, ModelsMissing):
        pass
    torch.manual_seed(0)
    tokens = [f"t{i}" for i in range(16)]
    setups = [Setup(x=torch.randn(1, 16, 384), module=mh.MultiHeadAttention(384, 12).eval(), tokens=tokens,
                    causal=False, input_code=("x", "x"), about=("random layer", "随机层"), heatmaps=False)
              for _ in range(6)]
    explorer = walkthrough_explorer(setups, tokens, filled("explorer_text", layers=6, heads=12, tokens=16))
    stories = told(lambda story: tell(story, setups[0]), ("en", "zh"))
    lesson_ = Lesson(lang="en", stories=stories, title=filled("title_text", text="random"), explorers=[explorer])
    return page.page_html(lesson_), "random layers"


def shot(tab) -> bytes:
    return tab.screenshot(full_page=False)


def test_clicking_a_head_hovering_a_token_and_switching_the_language(open_page):
    html, _ = big_page()
    tab, errors = open_page(html)
    assert tab.locator("#model-view .cell").count() == 6 * 12
    assert tab.locator("#model-view .cell.selected").count() == 1
    before = shot(tab)

    tab.click('#model-view .cell[data-row="3"][data-head="7"]')
    selected = tab.locator("#model-view .cell.selected")
    assert selected.count() == 1 and selected.get_attribute("data-row") == "3" and selected.get_attribute("data-head") == "7"
    assert "layer 3, head 7" in tab.inner_text("#head-view h3")
    assert "layer 3, head 7" in tab.inner_text("#step-view h3")
    after_click = shot(tab)
    assert after_click != before

    token = '#head-view .tokens.left .token[data-index="5"]'
    tab.hover(token)
    assert tab.locator(f"{token}.focus").count() == 1
    shares = [float(w) for w in tab.eval_on_selector_all("#head-view .tokens.right .token",
                                                          "nodes => nodes.map(n => n.dataset.weight)")]
    expected = tab.evaluate("() => { const w = JSON.parse(document.getElementById('mh-data').textContent)"
                            ".explorers[0].rows[3].weights; const L = w.shape[2];"
                            " return w.data.slice((7 * L + 5) * L, (7 * L + 6) * L); }")
    assert len(shares) == 16 and shares == expected and abs(sum(shares) - 1) < 0.01
    after_hover = shot(tab)
    assert after_hover != after_click

    tab.click('#head-view .modes button[data-mode="to"]')
    assert tab.locator('#head-view .modes button[data-mode="to"].on').count() == 1
    tab.mouse.move(5, 5)
    after_mode = shot(tab)
    assert after_mode != after_hover
    tab.hover('#head-view .tokens.right .token[data-index="0"]')
    column = [float(w) for w in tab.eval_on_selector_all("#head-view .tokens.left .token",
                                                          "nodes => nodes.map(n => n.dataset.weight)")]
    expected = tab.evaluate("() => { const w = JSON.parse(document.getElementById('mh-data').textContent)"
                            ".explorers[0].rows[3].weights; const L = w.shape[2];"
                            " return [...Array(L).keys()].map(i => w.data[(7 * L + i) * L]); }")
    assert len(column) == 16 and column == expected   # who attends to key 0: column 0 of the weights
    after_to_hover = shot(tab)
    assert after_to_hover != after_mode

    tab.click('.lang-switch button[data-set-lang="zh"]')
    assert tab.get_attribute("html", "lang") == "zh-CN" and tab.get_attribute("html", "data-lang") == "zh"
    assert "第 3 层，头 7" in tab.inner_text("#head-view h3")
    assert tab.locator('.lang-switch button[data-set-lang="zh"].on').count() == 1
    assert tab.eval_on_selector(".story .l-en", "n => getComputedStyle(n).display") == "none"
    assert tab.eval_on_selector(".story .l-zh", "n => getComputedStyle(n).display") != "none"
    assert shot(tab) != after_to_hover
    assert errors == []


def test_the_walkthrough_page_follows_a_token_through_the_mask(open_page):
    tab, errors = open_page(page.page_html(lesson(lang="en")))
    assert tab.locator("#model-view .cell").count() == 2   # the walkthrough's own model: 1 layer x 2 heads
    before = shot(tab)
    tab.click('#head-view .tokens.left .token[data-index="1"]')   # "journey" sees "Your" and itself
    assert "query “journey”" in tab.inner_text("#step-view h3")
    assert tab.locator('#step-view .step[data-step="6"] td.blocked').count() == 4
    weights = [float(t) for t in tab.eval_on_selector_all('#step-view .step[data-step="7"] td',
                                                         "cells => cells.map(c => c.textContent)")]
    assert weights[2:] == [0.0] * 4 and abs(sum(weights) - 1) < 1e-3
    checks = tab.locator('#step-view .step[data-step="7"] ul.checks li.ok')
    assert checks.count() == 2 and "✓" in checks.first.inner_text()
    assert shot(tab) != before and errors == []


def test_load_to_interactive_for_6_by_12_heads_on_16_tokens(browser, tmp_path, record_property, capsys):
    """The page sets window.mhReady = performance.now() once its views are drawn and wired: the time
    since navigation began (reading the file, parsing HTML and data, drawing 72 heatmaps, the head and
    step views). The issue asks for at most 1 s on this machine, so this one test asserts it, on the
    median of LOADS fresh loads (one slow load on a busy CI machine does not fail it); the number is
    recorded (record_property, and printed) for the report."""
    html, source = big_page()
    path = tmp_path / "big.html"
    path.write_text(html, encoding="utf-8")
    times = []
    for _ in range(LOADS):
        tab = browser.new_page(viewport={"width": 1200, "height": 1400})
        tab.goto(path.as_uri())
        tab.wait_for_function(READY, timeout=20_000)
        times.append(tab.evaluate("window.mhReady"))
        tab.close()
    median = statistics.median(times)
    size = len(html.encode()) / 2**20
    record_property("load_to_interactive_ms", round(median, 1))
    with capsys.disabled():
        print(f"\nload-to-interactive, 6 x 12 heads x 16 tokens ({source}, {size:.2f} MB): median {median:.0f} ms "
              f"of {LOADS} loads, all: {', '.join(f'{t:.0f}' for t in times)}")
    assert median <= INTERACTIVE_MS, times


def test_the_notebook_output_renders_in_a_browser(open_page):
    """What Jupyter shows for mh.explain(...) and for a capture record: an iframe whose page works."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(mh.MultiHeadAttention(16, 4), mh.MultiHeadAttention(16, 2))
    with torch.no_grad(), mh.capture_attention(model) as record:
        model(torch.randn(1, 6, 16))
    for output, cells in ((mh.explain("keys-vs-values", lang="zh")._repr_html_(), 2), (record._repr_html_(), 6)):
        tab, errors = open_page(f"<!DOCTYPE html><html><body>{output}</body></html>", ready=False)
        frame = tab.frame_locator("iframe.multihead-explain")
        frame.locator("html[data-ready='true']").wait_for()
        assert frame.locator("#model-view .cell").count() == cells
        assert errors == []


def test_at_400_px_the_key_column_stays_in_view_and_tokens_are_reached_with_the_keyboard(open_page):
    tab, errors = open_page(page.page_html(lesson(lang="en")), width=400, height=900)
    view = tab.locator("#head-view .headview").bounding_box()
    keys = tab.locator("#head-view .tokens.right").bounding_box()
    assert keys["x"] + keys["width"] <= min(400, view["x"] + view["width"]) + 1, (keys, view)
    assert tab.eval_on_selector("#head-view .headview", "n => n.scrollWidth <= n.clientWidth"), "no sideways scroll"
    assert tab.evaluate("() => document.documentElement.scrollWidth") <= 400, "wide tables scroll, not the page"
    for _ in range(30):   # Tab from the top until a token of the head view has the focus
        tab.keyboard.press("Tab")
        if tab.evaluate("() => document.activeElement.classList.contains('token')"):
            break
    focused = tab.evaluate("() => [document.activeElement.closest('.tokens').className,"
                           " document.activeElement.dataset.index]")
    assert focused == ["tokens left", "0"], "Tab reaches the first query token"
    assert tab.locator("#head-view .tokens.left .token.focus").count() == 1
    assert tab.locator("#head-view .tokens.right .token[data-weight]").count() == 6, "focus shows its weights"
    tab.keyboard.press("Tab")
    tab.keyboard.press("Enter")   # the second token, "journey", is followed in the step view
    assert "query “journey”" in tab.inner_text("#step-view h3")
    assert tab.evaluate("() => document.activeElement.dataset.index") == "1", "the redraw keeps the focus"
    tab.click('#head-view .modes button[data-mode="to"]')
    tab.focus('#head-view .tokens.right .token[data-index="2"]')
    assert tab.locator("#head-view .tokens.left .token[data-weight]").count() == 6
    assert tab.locator("#head-view .tokens.left .token[tabindex]").count() == 0, "only the active side is tabbed"
    assert errors == []


def test_the_heatmaps_are_svg_with_text_that_follows_the_language_switch(open_page):
    weights = torch.softmax(torch.randn(2, 4, 4, generator=torch.Generator().manual_seed(1)), -1)
    tokens = ["我", "喜欢", "注意力", "。"]
    stories = told(lambda story: story.figure(story.pick("weights", "权重"), weights, tokens=tokens), ("en", "zh"))
    tab, errors = open_page(page.page_html(Lesson(lang="en", stories=stories, title={"en": "t", "zh": "t"})))
    svgs = tab.locator(".story svg.heatmap")
    assert svgs.count() == 2 and tab.locator(".story img").count() == 0
    shown = ("n => [...n.querySelectorAll('tspan')].filter(t => getComputedStyle(t).display !== 'none')"
             ".map(t => t.textContent).join('')")
    assert tab.eval_on_selector(".story svg.heatmap text.title", shown) == "head 0"
    labels = tab.eval_on_selector_all(".story svg.heatmap text.tok", "nodes => nodes.map(n => n.textContent)")
    assert labels[:4] == tokens
    widths = tab.eval_on_selector_all(".story svg.heatmap text.tok", "nodes => nodes.map(n => n.getBBox().width)")
    assert min(widths) > 5, "the browser's fonts draw the Chinese tokens"
    assert "rows: queries" in tab.inner_text(".story .heatmaps .note")
    tab.click('.lang-switch button[data-set-lang="zh"]')
    assert tab.eval_on_selector(".story svg.heatmap text.title", shown) == "头 0"
    assert "行是查询" in tab.inner_text(".story .heatmaps .note")
    assert errors == []
