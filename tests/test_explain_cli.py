"""`multihead explain` end to end: the default walkthrough in both languages, the locale default,
--list and --topic, exit codes, the 80-column width, and one run of the installed console script."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import plain_terminal
from rich.cells import cell_len
from rich.console import Console

from multihead.cli import main
from multihead.explain.walkthrough import steps as walkthrough
from multihead.explain.cli import topic_story
from multihead.explain.render.html import render_html
from multihead.explain.render.terminal import render
from multihead.explain.topics import TOPICS


@pytest.fixture(autouse=True)
def plain_80_column_terminal(monkeypatch):
    plain_terminal(monkeypatch, 80)


def run(capsys, *argv):
    code = main(["explain", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_default_walkthrough_in_english(capsys):
    code, out, _ = run(capsys)
    assert code == 0
    for number in range(1, len(walkthrough.STEPS) + 1):
        assert walkthrough.step_title(number)[0] in out
    assert "Step 4 · Attention scores: Q @ Kᵀ" in out
    assert "✗" not in out and "All " in out and "checks passed" in out
    assert "max |diff|" in out
    assert max(cell_len(line) for line in out.splitlines()) <= 80
    closing = out[out.index("Questions from the documents, answered live"):]
    assert all(name in closing for name in TOPICS), "the closing note lists every topic"


def test_default_walkthrough_in_chinese(capsys):
    code, out, _ = run(capsys, "--lang", "zh")
    assert code == 0
    for number in range(1, len(walkthrough.STEPS) + 1):
        assert walkthrough.step_title(number)[1] in out
    assert "第 4 步 · 注意力分数：Q @ Kᵀ" in out
    for term in ("多头注意力", "掩码", "转置", "注意力权重", "形状", "步幅", "连续"):
        assert term in out, term
    assert "✗" not in out and "项检查都通过了" in out
    closing = out[out.index("文档里的问题"):]
    assert all(name in closing for name in TOPICS), "the closing note lists every topic"
    assert max(cell_len(line) for line in out.splitlines()) <= 80


def test_the_locale_picks_chinese_and_lang_overrides_it(capsys, monkeypatch):
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    code, out, _ = run(capsys)
    assert code == 0 and "第 1 步" in out
    code, out, _ = run(capsys, "--lang", "en")
    assert code == 0 and "Step 1 ·" in out and "第 1 步" not in out


def test_a_failed_check_exits_1(capsys, monkeypatch):
    original = walkthrough.default_setup

    def wrong_setup():
        setup = original()
        setup.expected = setup.expected + 0.01  # a claim that is now false
        return setup

    monkeypatch.setattr(walkthrough, "default_setup", wrong_setup)
    code, out, _ = run(capsys)
    assert code == 1
    assert "✗ FAILED" in out and "1 of" in out


def test_list_names_every_topic(capsys):
    code, out, _ = run(capsys, "--list")
    assert code == 0
    assert TOPICS, "the topic registry is empty"
    for name, topic in TOPICS.items():
        assert name in out and topic.document in out


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_topic_runs_with_its_title_and_question(capsys, lang):
    name, topic = next(iter(TOPICS.items()))
    code, out, _ = run(capsys, "--topic", name, "--lang", lang)
    assert code == 0
    assert topic.title[lang] in out.replace("\n", "")
    assert ("Question from document" if lang == "en" else "中的问题") in out
    assert "✗" not in out


@pytest.mark.parametrize("name", list(TOPICS))
def test_every_topic_renders_in_80_columns_and_as_html(name):
    for lang in ("en", "zh"):
        story = topic_story(name, lang)
        assert story.failed_checks == [] and story.checks, (name, lang)
        console = Console(width=80, record=True, file=io.StringIO())
        render(story, console)
        text = console.export_text()
        assert max(cell_len(line) for line in text.splitlines()) <= 80, (name, lang)
        html = render_html([story], lang)
        assert "<script" not in html and 'src="http' not in html and 'href="http' not in html


def test_an_unknown_topic_exits_2_naming_the_known_ones(capsys):
    code, out, err = run(capsys, "--topic", "no-such-topic")
    assert code == 2 and out == ""
    assert "no-such-topic" in err and next(iter(TOPICS)) in err.replace("\n", "")


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_topic_runs_as_a_positional_name_too(capsys, lang):
    name, topic = next(iter(TOPICS.items()))
    code, out, _ = run(capsys, name, "--lang", lang)
    assert code == 0 and topic.title[lang] in out.replace("\n", "") and "✗" not in out
    code, spelled, _ = run(capsys, name.upper().replace("-", "_"), "--lang", lang)
    assert code == 0 and spelled == out, "case and underscores are forgiven"


@pytest.mark.parametrize(("asked", "meant"), [("reshape", ["reshape-then-transpose"]),
                                              ("masked-fil", ["masked-fill", "mask-fill-value"]),
                                              ("mask", ["masked-fill", "mask-fill-value", "mask-asserts"])])
def test_a_near_miss_answers_did_you_mean(capsys, asked, meant):
    code, out, err = run(capsys, asked)
    assert code == 2 and out == ""
    err = " ".join(err.split())
    assert f"Did you mean: {', '.join(meant)}?" in err and "multihead explain --list" in err
    code, _, err = run(capsys, "--topic", asked, "--lang", "zh")
    assert code == 2 and "你要找的是不是" in err and meant[0] in err


def test_a_positional_topic_with_another_mode_exits_2(capsys):
    for other in (["--topic", "rope"], ["--list"], ["--text", "hello"]):
        code, out, err = run(capsys, "kv-cache", *other)
        assert code == 2 and out == "" and "give the topic once" in err, other


def test_an_unwritable_html_path_exits_2(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run(capsys, "--html", str(blocker / "report.html"))
    assert code == 2 and "cannot write" in err


def test_list_topic_and_text_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["explain", "--list", "--topic", "x"])
    assert exc.value.code == 2
    assert "not allowed with" in capsys.readouterr().err


def test_the_walkthrough_does_not_touch_the_callers_random_state(capsys):
    torch.manual_seed(3)
    expected = torch.rand(2)
    torch.manual_seed(3)
    run(capsys)
    assert torch.equal(torch.rand(2), expected)


def console_script() -> Path | None:
    """The installed `multihead` command next to this interpreter, if any."""
    found = Path(sys.executable).parent / "multihead"
    return found if found.exists() else (Path(p) if (p := shutil.which("multihead")) else None)


@pytest.mark.slow
def test_the_installed_console_script_runs_the_walkthrough(tmp_path):
    script = console_script()
    if script is None:
        pytest.skip("the `multihead` console script is not installed (pip install -e .)")
    unset = ("LC_ALL", "LC_MESSAGES", "LANG", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env["COLUMNS"] = "80"
    done = subprocess.run([str(script), "explain"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Step 11 ·" in done.stdout and "checks passed" in done.stdout
    assert max(cell_len(line) for line in done.stdout.splitlines()) <= 80


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_topic_list_never_cuts_a_name_and_goes_row_by_row_when_too_narrow(capsys, monkeypatch, lang):
    """At 44 columns the question column would be narrower than a run of code: one row at a time instead."""
    for width, stacked in ((44, True), (100, False)):
        monkeypatch.setenv("COLUMNS", str(width))
        code, out, _ = run(capsys, "--list", "--lang", lang)
        lines = out.splitlines()
        assert code == 0 and max(cell_len(line) for line in lines) <= width
        assert all(any(name in line for line in lines) for name in TOPICS)
        name_label = "名称：" if lang == "zh" else "name: "
        assert any(line.startswith(name_label + "reshape-then-transpose") for line in lines) == stacked
        assert "docs/textbook.md" in out.replace("\n", "")
