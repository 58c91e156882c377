"""`multihead check` on the command line: rich PASS/FAIL panels, exit codes 0/1/2, EN/ZH; and the
library entry point working without rich."""
from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import edited_zoo_file
from multihead.cli import main

ZOO = Path(__file__).parent / "check_zoo"


def run_cli(capsys, *argv) -> tuple[int, str]:
    """Exit code and the printed text with the panel's borders and line wrapping removed."""
    code = main(["check", *argv])
    words = capsys.readouterr().out.replace("│", " ").replace("╭", " ").replace("╰", " ").split()
    return code, " ".join(w for w in words if set(w) != {"─"})


def test_pass_panel_and_exit_0(capsys):
    code, out = run_cli(capsys, str(ZOO / "ok_fused_causal.py:Block"))
    assert code == 0
    assert "PASS" in out and "c_attn rows 0:16" in out and "causal inside the module" in out


def test_fail_panel_names_the_bug_and_topic(capsys):
    code, out = run_cli(capsys, str(ZOO / "fused_no_scale.py:FusedSelfAttention"))
    assert code == 1
    assert "FAIL: scores not scaled (missing-scale)" in out and "multihead explain scale-sqrt-dk" in out


def test_chinese_report(capsys):
    code, out = run_cli(capsys, str(ZOO / "split_by_reshape.py:TinyAttn"), "--lang", "zh")
    assert code == 1
    assert "未通过" in out and "transpose(1, 2)" in out and "检测到的约定" in out


def test_unknown_difference_reports_the_measured_error(capsys, tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("s.softmax(-1) @ v", "(s.softmax(-1) @ v) * 1.5"))
    code, out = run_cli(capsys, f"{learner}:LazyAttention")
    assert code == 1
    assert "catalogue does not know" in out and "max error" in out


def test_call_hints_and_init(capsys):
    code, out = run_cli(capsys, str(ZOO / "ok_seq_first_einsum.py:TimeMajorAttention"),
                        "--init", '{"heads": 2, "d_model": 8}', "--call", "layout=seq,heads=2")
    assert code == 0 and "2 heads of size 4" in out


def test_an_exception_is_shown_once_with_its_line(capsys, tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("self.po(y)", "self.p0(y)"), name="typo_attr.py")
    code, out = run_cli(capsys, f"{learner}:LazyAttention")
    assert code == 1 and "FAIL" in out
    assert out.count("no attribute 'p0'") == 1 and "typo_attr.py:" in out


@pytest.mark.parametrize("argv, words", [
    (["missing.py:A"], ["ERROR", "no such file"]),
    ([str(ZOO / "ok_lazy.py:LazyAttention"), "--init", "{bad"], ["ERROR", "not valid JSON"]),
    ([str(ZOO / "ok_lazy.py:Nope")], ["ERROR", "not found"]),
    ([str(ZOO / "ok_lazy.py:LazyAttention"), "--call", "layout=sideways"], ["ERROR", "batch, seq"]),
])
def test_could_not_run_exits_2(capsys, argv, words):
    code, out = run_cli(capsys, *argv)
    assert code == 2
    for word in words:
        assert word in out


def test_library_check_works_without_rich():
    script = (
        "import sys; sys.modules['rich'] = None\n"
        "from multihead.checker import check\n"
        f"r = check({str(ZOO / 'weights_times_keys.py:Attention')!r})\n"
        "assert r.bug == 'keys-used-as-values', r\n"
        "assert 'rich' not in [m.split('.')[0] for m in sys.modules if sys.modules[m] is not None]\n"
        "print(r.to_dict()['topic'])\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "keys-vs-values"


def test_sessions_in_the_docs_are_real(capsys):
    """Every `$ multihead check ...` session in docs/check.md gives the exit code and verdict shown."""
    doc = (Path(__file__).parent.parent / "docs" / "check.md").read_text()
    sessions = re.findall(r"\$ multihead check ([^\n]+)\n(.*?)\n\$ echo \$\?\n(\d)", doc, flags=re.S)
    assert len(sessions) >= 6
    for argv, panel, code in sessions:
        headline = panel.splitlines()[1].strip("│ ").split(":")[0].split("：")[0]
        got_code, out = run_cli(capsys, *shlex.split(argv))
        assert got_code == int(code), argv
        assert out.startswith(headline) or headline in out, (argv, headline)


def test_the_report_follows_a_chinese_locale(capsys, monkeypatch):
    for var in ("LC_ALL", "LC_MESSAGES"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LANG", "zh_CN.UTF-8")
    code, out = run_cli(capsys, str(ZOO / "split_by_reshape.py:TinyAttn"))
    assert code == 1
    assert out.startswith("未通过：拆分多头时缺少 transpose（reshape-without-transpose）")
    assert "详细讲解：multihead explain reshape-then-transpose" in out
    code, out = run_cli(capsys, str(ZOO / "split_by_reshape.py:TinyAttn"), "--lang", "en")
    assert out.startswith("FAIL: heads split without a transpose (reshape-without-transpose)")


@pytest.mark.parametrize("target", ["mask_sign_flipped.py:FlippedSignAttention",
                                    "raises_mask_fill_typo.py:TypoMaskAttention",
                                    "mla_wuk_transposed.py:CompressedKVAttention"])
def test_chinese_lines_fit_80_columns_without_cutting_code(capsys, monkeypatch, target):
    from rich.cells import cell_len
    from multihead.checker import check
    monkeypatch.setenv("COLUMNS", "80")
    main(["check", str(ZOO / target), "--lang", "zh"])
    lines = capsys.readouterr().out.splitlines()
    assert all(cell_len(line) <= 80 for line in lines) and "…" not in "".join(lines)
    report = check(str(ZOO / target), lang="zh")
    whole = "\n".join([report.headline(), *report.detail_lines(), *report.convention_lines()])
    code = set(re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", whole))  # every identifier, call and number
    shown = {word for line in lines for word in re.findall(r"[A-Za-z_][A-Za-z0-9_.]*", line)}
    assert code <= shown, code - shown
