"""Which language the tools speak, English or Chinese: one rule for every command, its --help included.

``--lang en|zh`` wins. Without it the locale decides, as gettext reads it: LANGUAGE (its first entry),
then LC_ALL, LC_MESSAGES, LANG; the first one set decides, and a value starting with "zh" means Chinese.
As in gettext, LANGUAGE is ignored when the locale is set to C or POSIX (LC_ALL=C asks for untranslated
messages); with no locale set at all, LANGUAGE still counts.
"""
from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from multihead.errors import AttentionError

LANGS = ("en", "zh")
LOCALE_VARS = ("LC_ALL", "LC_MESSAGES", "LANG")  # POSIX precedence: the first one set wins


def _speaks_chinese(value: str) -> bool:
    return value.lower().startswith("zh")


def resolve_lang(choice: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """`choice` if given ("en" or "zh"), else "zh" when the locale says Chinese, else "en"."""
    if choice is not None:
        if choice not in LANGS:
            raise AttentionError(f"--lang must be one of {LANGS}; got {choice!r}.")
        return choice
    environ = os.environ if environ is None else environ
    locale = next((environ[var] for var in LOCALE_VARS if environ.get(var)), "")
    language = environ.get("LANGUAGE", "").split(":")[0]
    if language and locale.split(".")[0] not in ("C", "POSIX"):
        return "zh" if _speaks_chinese(language) else "en"
    return "zh" if _speaks_chinese(locale) else "en"


def lang_in_argv(argv: Sequence[str]) -> str | None:
    """The language a command line asks for with ``--lang en|zh`` (or ``--lang=zh``), None when it asks for
    none or for one that does not exist (argparse then says so): read before parsing, so that --help
    placed before --lang still speaks it."""
    for index, arg in enumerate(argv):
        value = arg.partition("=")[2] if arg.startswith("--lang=") else (
            argv[index + 1] if arg == "--lang" and index + 1 < len(argv) else None)
        if value in LANGS:
            return value
    return None


def pick(lang: str, en: str, zh: str) -> str:
    """The text in `lang`: `zh` for "zh", else `en`."""
    return zh if lang == "zh" else en
