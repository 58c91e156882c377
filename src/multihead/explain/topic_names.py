"""How a typed name finds its topic: the name itself (case, `_` and spaces forgiven), a word people use for
it in English or Chinese (the words files' "aliases": 掩码, 缩放, rotary ...), else "did you mean" with
the names it is close to ("masks" -> the mask topics, "masked-fil" -> masked-fill).

An alias that belongs to one topic finds it; one that belongs to several (掩码) offers them, in the order
of the aliases table. A Chinese name also finds the longest alias it contains (多头注意力机制 -> 多头注意力).
"""
from __future__ import annotations

import difflib
import re

from multihead.errors import AttentionError
from multihead.explain import words
from multihead.explain.words import ui
from multihead.terminal.language import LANGS

CJK = re.compile(r"[\u4e00-\u9fff]")
MOST = 3   # names offered at most


def spelled(name: str) -> str:
    """The name as topics spell theirs: lower case, `-` for `_` and spaces (none around Chinese words)."""
    squeezed = re.sub(r"\s+", "" if CJK.search(name) else " ", name.strip())
    return squeezed.lower().replace("_", "-").replace(" ", "-")


def singular(name: str) -> str:
    """An English plural's singular, roughly: "masks" -> "mask", "caches" -> "cache", "heads" -> "head"."""
    return name[:-1] if name.endswith("s") and not name.endswith("ss") and len(name) > 3 else name


def aliases() -> dict[str, list[str]]:
    """{alias as spelled: its topics, in table order}, from both languages' words files."""
    found: dict[str, list[str]] = {}
    for lang in LANGS:
        for topic, said in words.words(lang)["aliases"].items():
            for alias in said:
                topics = found.setdefault(spelled(alias), [])
                topics.extend([topic] if topic not in topics else [])
    return found


def alias_topics(name: str) -> list[str]:
    """The topics `name` is another word for: an alias spelled alike, or, for a Chinese name, the longest
    aliases it contains."""
    wanted, table = spelled(name), aliases()
    if wanted in table:
        return table[wanted]
    inside = [alias for alias in table if CJK.search(alias) and len(alias) > 1 and alias in wanted]
    longest = max(map(len, inside), default=0)
    return list(dict.fromkeys(t for alias in inside if len(alias) == longest for t in table[alias]))


def near_topics(name: str, known: tuple[str, ...]) -> list[str]:
    """The known topic names a mistyped `name` probably meant, best first (at most 3): the names that
    start with it or with its singular, or hold it as a whole part ("reshape" -> "reshape-then-transpose"),
    then the ones spelled alike ("masked-fil" -> "masked-fill")."""
    wanted = spelled(name)
    if not wanted:
        return []
    forms = dict.fromkeys((wanted, singular(wanted)))
    starts = [k for k in known if any(k.startswith(form) for form in forms)]
    parts = [k for k in known if k not in starts and any(form in k.split("-") for form in forms)]
    alike = [k for k in difflib.get_close_matches(wanted, known, n=MOST, cutoff=0.6) if k not in starts + parts]
    return (starts + parts + alike)[:MOST]


def known_topic(name: str, known: tuple[str, ...], lang: str) -> str:
    """The topic `name` asks for: itself (case, `_` and spaces forgiven), or the one topic an alias of it
    names; else AttentionError in `lang` offering the topics the alias names, or "did you mean" with the
    close names, or the whole list."""
    if name in known or spelled(name) in known:
        return name if name in known else spelled(name)
    meant = [topic for topic in alias_topics(name) if topic in known]
    if len(meant) == 1:
        return meant[0]
    separator = "、" if lang == "zh" else ", "
    if meant:
        raise AttentionError(ui("several_topics", lang, name=name, near=separator.join(meant[:MOST])))
    close = near_topics(name, known)
    if close:
        raise AttentionError(ui("unknown_topic_near", lang, name=name, near=separator.join(close)))
    raise AttentionError(ui("unknown_topic", lang, name=name, known=separator.join(known) or "-"))
