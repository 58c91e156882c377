"""One language rule for every command and its --help: --lang, else LANGUAGE / LC_ALL / LC_MESSAGES / LANG."""
from __future__ import annotations

import pytest

from multihead import AttentionError
from multihead.terminal.language import lang_in_argv, pick, resolve_lang


def test_resolve_lang_follows_the_locale_precedence():
    assert resolve_lang("zh", {"LANG": "en_US.UTF-8"}) == "zh"
    assert resolve_lang(None, {"LANG": "zh_CN.UTF-8"}) == "zh"
    assert resolve_lang(None, {"LC_ALL": "en_US.UTF-8", "LANG": "zh_CN.UTF-8"}) == "en"
    assert resolve_lang(None, {"LC_MESSAGES": "zh_TW", "LANG": "C"}) == "zh"
    assert resolve_lang(None, {"LC_ALL": "", "LANG": "C.UTF-8"}) == "en"
    assert resolve_lang(None, {}) == "en"
    with pytest.raises(AttentionError, match="--lang"):
        resolve_lang("fr", {})


def test_language_comes_first_as_in_gettext_except_under_the_c_locale():
    assert resolve_lang(None, {"LANGUAGE": "zh_CN:en", "LANG": "en_US.UTF-8"}) == "zh"
    assert resolve_lang(None, {"LANGUAGE": "en", "LC_ALL": "zh_CN.UTF-8"}) == "en"
    assert resolve_lang(None, {"LANGUAGE": "zh_CN"}) == "zh"  # no locale set at all: LANGUAGE still counts
    assert resolve_lang(None, {"LANGUAGE": "zh_CN", "LC_ALL": "C"}) == "en"
    assert resolve_lang(None, {"LANGUAGE": "zh_CN", "LANG": "C.UTF-8"}) == "en"
    assert resolve_lang(None, {"LANGUAGE": "", "LANG": "zh_TW.UTF-8"}) == "zh"


def test_the_lang_option_is_read_before_parsing():
    assert lang_in_argv(["check", "--help", "--lang", "zh"]) == "zh"
    assert lang_in_argv(["explain", "--lang=en"]) == "en"
    assert lang_in_argv(["explain", "--lang", "fr"]) is None and lang_in_argv(["explain", "--lang"]) is None
    assert pick("zh", "a", "甲") == "甲" and pick("en", "a", "甲") == "a"
