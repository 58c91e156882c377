"""The `multihead` command hub: one subcommand per tool, each imported only when chosen."""
from __future__ import annotations

import subprocess
import sys

import pytest
from rich.cells import cell_len

from multihead import cli
from multihead.terminal.help import error_text


def test_parser_offers_every_tool():
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == {"explain", "check", "bench"}


def test_missing_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main([])
    assert info.value.code == 2 and "COMMAND" in capsys.readouterr().err


def test_only_the_chosen_tool_is_imported():
    code = "import sys; from multihead import cli; cli.build_parser('explain'); print('multihead.bench.cli' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_console_entry_point_runs():
    result = subprocess.run([sys.executable, "-m", "multihead", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "explain" in result.stdout and "bench" in result.stdout


def _helps(parser) -> list[str]:
    """Every help text of a parser and of its subcommands' parsers (the chosen ones are configured)."""
    texts = [parser.description or ""]
    for action in parser._actions:
        texts.append(action.help or "")
        for choice in getattr(action, "_choices_actions", []):
            texts.append(choice.help or "")
    return [text for text in texts if text]


@pytest.mark.parametrize("chosen", [None, "explain", "check", "bench"])
def test_every_help_text_exists_in_both_languages(chosen):
    english, chinese = cli.build_parser(chosen, "en"), cli.build_parser(chosen, "zh")
    if chosen is not None:
        english, chinese = (next(a for a in p._actions if a.dest == "command").choices[chosen] for p in (english, chinese))
    en_texts, zh_texts = _helps(english), _helps(chinese)
    assert len(en_texts) == len(zh_texts) > 2
    for en, zh in zip(en_texts, zh_texts):
        assert not any(cell_len(ch) == 2 for ch in en), en
        assert any(cell_len(ch) == 2 for ch in zh), zh


@pytest.mark.parametrize("argv", [["--help"], ["explain", "--help"], ["check", "--help"], ["bench", "--help"]])
@pytest.mark.parametrize("locale", ["LANG", "LC_ALL", "LANGUAGE"])
def test_help_speaks_chinese_under_a_chinese_locale_and_fits_the_terminal(argv, locale, monkeypatch, capsys):
    for var in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(locale, "zh_CN.UTF-8")
    monkeypatch.setenv("COLUMNS", "60")
    with pytest.raises(SystemExit) as info:
        cli.main(argv)
    out = capsys.readouterr().out
    assert info.value.code == 0 and out.startswith("用法：multihead") and "选项：" in out and "显示本帮助并退出" in out
    assert "usage:" not in out and "show this help" not in out
    after_usage = out.split("\n\n", 1)[1]  # argparse lays out the usage itself, by option groups
    assert max(cell_len(line) for line in after_usage.splitlines()) <= 60


def test_help_speaks_english_by_default_and_follows_lang_given_after_help(monkeypatch, capsys):
    for var in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(SystemExit):
        cli.main(["check", "--help"])
    assert capsys.readouterr().out.startswith("usage: multihead check")
    with pytest.raises(SystemExit):
        cli.main(["check", "--help", "--lang", "zh"])
    assert capsys.readouterr().out.startswith("用法：multihead check")


def test_usage_errors_speak_the_locale_s_language(monkeypatch, capsys):
    monkeypatch.setenv("LC_ALL", "zh_CN.UTF-8")
    with pytest.raises(SystemExit) as info:
        cli.main(["check"])
    assert info.value.code == 2 and "multihead check：错误：缺少必需的参数：FILE.py:Class" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["explain", "--lang", "fr"])
    assert "参数 --lang 的取值 'fr' 无效" in capsys.readouterr().err
    assert error_text("something argparse never said before", "zh") == "something argparse never said before"


@pytest.mark.parametrize(("lang", "said"), [("en", "this command needs the 'cli' extra"),
                                            ("zh", "这个命令需要安装 cli 这组可选依赖")])
def test_a_missing_cli_extra_exits_2_saying_what_to_install_in_the_users_language(lang, said, capsys, monkeypatch):
    def missing(module_path):
        raise ImportError("No module named 'rich'", name="rich")

    monkeypatch.setattr(cli.importlib, "import_module", missing)
    with pytest.raises(cli.MissingExtra) as info:
        cli.main(["explain", "--lang", lang])
    err = capsys.readouterr().err
    assert info.value.code == 2 and said in err and 'pip install -e ".[cli]"' in err and "rich" in err
