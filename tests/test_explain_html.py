"""The HTML page: self-contained (inline CSS and JS, inline SVG heatmaps, nothing loaded from anywhere),
every step and check in it, escaped text, and a real render in headless Chromium."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image
import pytest
import torch

from multihead.cli import main
from multihead.explain.walkthrough import steps as walkthrough
from multihead.explain.render.html import render_html
from multihead.explain.render.svg import cut, heatmaps_svg, shade
from multihead.explain.story import Story
from multihead.explain.topics import TOPICS

HEATMAPS = '<div class="heatmaps">'


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("html") / "report.html"
    assert main(["explain", "--lang", "en", "--html", str(path)]) == 0
    return path.read_text(encoding="utf-8")


def assert_self_contained(html: str) -> None:
    """Nothing is loaded from anywhere: images are data: URIs, scripts and styles are inline (the page's
    own code and data), no link, no import, no URL at all, nothing that could fetch one."""
    assert html.startswith("<!DOCTYPE html>") and "<style>" in html
    for attribute in re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', html):
        assert attribute.startswith("data:"), attribute
    assert "http" not in "".join(re.findall(r'(?:src|href)\s*=\s*"[^"]*"', html))
    assert "<link" not in html and "@import" not in html and "url(" not in html
    assert all("src" not in attributes for attributes in re.findall(r"<script\b([^>]*)>", html))
    assert not re.search(r"(?:https?|ftp)://", html)
    assert not any(call in html for call in ("fetch(", "XMLHttpRequest", "import(", "WebSocket", "EventSource"))


def test_the_report_is_self_contained(report):
    assert_self_contained(report)


def test_the_report_has_every_step_its_tensors_and_a_heatmap(report, capsys):
    for number in range(1, len(walkthrough.STEPS) + 1):
        assert f"<h2>{walkthrough.step_title(number)[0]}</h2>" in report
    assert "<h2>Step 4 · Attention scores: Q @ Kᵀ</h2>" in report
    assert report.count('class="tensor"') >= len(walkthrough.STEPS)
    assert 'class="check failed"' not in report and 'class="summary ok"' in report
    assert report.count(HEATMAPS) == 1  # step 7's per-head heatmaps
    assert report.count('<svg class="heatmap"') == 2 and report.count("<rect ") == 2 * 6 * 6
    assert "head 1" in report and "rows: queries, columns: keys" in report


def test_heatmaps_have_one_svg_per_head_with_real_text_labels():
    weights = torch.softmax(torch.randn(12, 5, 5, generator=torch.Generator().manual_seed(0)), -1)
    svg = heatmaps_svg(weights, ["我", "喜", "欢", "<b>", "x"], ("en", "zh"))
    assert svg.count('<svg class="heatmap"') == 12 and svg.count("<rect ") == 12 * 25
    assert '<tspan class="l-en">head 11</tspan><tspan class="l-zh">头 11</tspan>' in svg
    assert ">喜</text>" in svg and "&lt;b&gt;" in svg and "<b>" not in svg, "tokens are escaped text"
    assert f"{weights[3, 1, 2].item():.2f}</text>" in svg, "small maps write their weights in the cells"
    assert (shade(0.0), shade(1.0)) == ("#ffffff", "#2a6f97") and cut("▁" * 12) == "▁" * 9 + "…"
    big = heatmaps_svg(torch.full((1, 20, 20), 0.05), None)
    assert big.count("<rect ") == 400 and "<title>" not in big and "l-zh" not in big


def test_text_is_escaped_and_failures_are_listed():
    story = Story("zh")
    story.heading("<b>bold</b>", "<b>粗体</b>")
    story.check("a < b", "a < b 不成立", False, "1 > 0")
    html = render_html([story], "zh")
    assert "<b>" not in html and "&lt;b&gt;粗体&lt;/b&gt;" in html
    assert 'class="check failed"' in html and 'class="summary failed"' in html and 'lang="zh-CN"' in html


def test_a_topic_report_is_self_contained_too(tmp_path, capsys):
    name, topic = next(iter(TOPICS.items()))
    path = tmp_path / "sub" / "topic.html"
    assert main(["explain", "--topic", name, "--lang", "zh", "--html", str(path)]) == 0
    html = path.read_text(encoding="utf-8")
    assert_self_contained(html)
    assert topic.title["zh"] in html and "项检查都通过了" in html
    assert str(path) in capsys.readouterr().out.replace("\n", "")


def find_chromium() -> str | None:
    return shutil.which("chromium") or (p if Path(p := "/usr/bin/chromium").exists() else None)


@pytest.mark.browser
@pytest.mark.slow
def test_the_report_renders_in_headless_chromium(tmp_path, report):
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (scripts/install-test-deps.sh installs it in CI)")
    page = tmp_path / "report.html"
    page.write_text(report, encoding="utf-8")
    shot = tmp_path / "out.png"
    profile = tmp_path / "profile"
    profile.mkdir()
    command = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={profile}", f"--screenshot={shot}", "--window-size=1200,2000",
               page.as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert shot.exists(), done.stderr[-2000:]
    pixels = matplotlib.image.imread(str(shot))
    assert pixels.shape[:2] == (2000, 1200)
    rgb = pixels[..., :3]
    not_white = (rgb.min(axis=-1) < 0.9).mean()
    assert rgb.std() > 0.05 and not_white > 0.02, (rgb.std(), not_white)
