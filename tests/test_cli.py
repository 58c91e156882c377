"""The `multihead` command hub: one subcommand per tool, each imported only when chosen."""
from __future__ import annotations

import subprocess
import sys

import pytest

from multihead import cli


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
