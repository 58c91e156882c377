"""docs/explain.md cannot drift: its topic table is the registry, and its terminal sessions are real."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from helpers import plain_terminal

from multihead.cli import main
from multihead.explain.topics import TOPICS

DOC = Path(__file__).resolve().parents[1] / "docs" / "explain.md"
ROW = re.compile(r"^\| (\d{3}|—) \| (.+?) \| `([a-z0-9-]+)` \|")   # —: the project's own question
SESSION = re.compile(r"^```\n\$ (multihead explain[^\n]*)\n(.*?)^```", re.S | re.M)


def topic_rows() -> list[tuple[str, str, str]]:
    """(document, question, topic) for each row of the doc's question table."""
    return [m.groups() for line in DOC.read_text(encoding="utf-8").splitlines() if (m := ROW.match(line))]


def test_the_question_table_lists_every_topic_once_in_registry_order():
    assert [name for _, _, name in topic_rows()] == list(TOPICS)


@pytest.mark.parametrize("document,question,name", topic_rows())
def test_each_row_shows_its_topics_own_document_and_question(document, question, name):
    assert name in TOPICS, f"docs/explain.md lists {name!r}, which is not a topic"
    assert (document, question) == (TOPICS[name].document, TOPICS[name].question["en"])


def sessions() -> list[tuple[str, list[str]]]:
    """(command, shown lines) for each `$ multihead explain ...` block; `...` marks left-out lines."""
    found = []
    for command, body in SESSION.findall(DOC.read_text(encoding="utf-8")):
        found.append((command, [line.rstrip() for line in body.splitlines() if line.strip()]))
    return found


def test_the_doc_shows_sessions():
    assert {command for command, _ in sessions()} >= {"multihead explain",
                                                      "multihead explain param-count"}


@pytest.mark.parametrize("command,shown", sessions())
def test_sessions_in_the_doc_are_real(command, shown, capsys, monkeypatch):
    """Every line shown appears in the real output, in the same order."""
    plain_terminal(monkeypatch, 80)
    code = main(shlex.split(command)[1:])
    real = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert code == 0
    position = 0
    for line in shown:
        if line == "...":
            continue
        assert line in real[position:], f"not in the output of {command!r} (in this order): {line!r}"
        position = real.index(line, position) + 1
