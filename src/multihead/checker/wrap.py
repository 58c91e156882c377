"""Line breaking for the terminal report, in English and Chinese alike.

A line may break at a space or between two Chinese characters, never inside a run of code (an
identifier, a call, a shape such as ``reshape(B, L, H, D)`` is cut only at its own spaces). Chinese
closing punctuation never starts a line and opening punctuation never ends one. Nothing is cut off with
"…": a run longer than the whole width is split after a "/" or ":" (a path), or, failing that, folded.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable

CLOSING = set("，。、；：！？）》」』”’")
OPENING = set("（《「『“‘")


def cells(text: str) -> int:
    """Terminal columns taken by ``text``: 2 for wide (Chinese) characters, 1 otherwise."""
    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _wide(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in "WF"


def _tokens(text: str) -> list[str]:
    """Spaces, single wide characters and runs of other characters; punctuation glued where it must stay."""
    raw = [m.group() for m in re.finditer(r" +|[^ ]", text)]
    tokens: list[str] = []
    for piece in raw:
        joins_run = tokens and not piece.isspace() and not _wide(piece) and not tokens[-1].isspace() \
            and not _wide(tokens[-1][-1]) and tokens[-1][-1] not in CLOSING
        if piece in CLOSING and tokens and not tokens[-1].isspace():
            tokens[-1] += piece  # never start a line with a closing mark
        elif joins_run or (tokens and tokens[-1][-1] in OPENING and not piece.isspace()):
            tokens[-1] += piece  # one run of code, or an opening mark kept with what follows
        else:
            tokens.append(piece)
    return tokens


def _split_long(token: str, width: int, measure: Callable[[str], int]) -> list[str]:
    """A token wider than the line: cut after "/" or ":" where possible, else fold."""
    parts, current = [], ""
    for piece in re.findall(r"[^/:]*[/:]?", token):
        if current and measure(current + piece) > width:
            parts.append(current)
            current = ""
        current += piece
        while measure(current) > width:  # one piece alone is too wide: fold it
            cut = max(1, next(i for i in range(len(current), 0, -1) if measure(current[:i]) <= width))
            parts.append(current[:cut])
            current = current[cut:]
    return parts + ([current] if current else [])


def wrap(text: str, width: int, measure: Callable[[str], int] = cells) -> list[str]:
    """``text`` (one paragraph, or several separated by newlines) broken into lines of at most ``width``."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        line, space = "", False
        for token in _tokens(paragraph):
            if token.isspace():
                space = bool(line)
                continue
            joined = line + (" " if space else "") + token
            if measure(joined) <= width:
                line, space = joined, False
                continue
            if line:
                lines.append(line)
            pieces = _split_long(token, width, measure) if measure(token) > width else [token]
            lines.extend(pieces[:-1])
            line, space = pieces[-1], False
        lines.append(line)
    return lines
