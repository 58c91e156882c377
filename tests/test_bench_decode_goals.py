"""benchmarks/decode_goals.py (the decode kernel's goals per build) on tiny sizes: every part's rows, each row's
build and ISA, the targets and the machine land in its JSON; the committed results hold every target per ISA."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from multihead.backends.cpu import build as decode_build

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def test_the_goals_script_measures_every_part_per_build(tmp_path):
    spec = importlib.util.spec_from_file_location("decode_goals", BENCH / "decode_goals.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = script.main(["--tiny", "--rounds", "1", "--repeats", "1", "--out", str(tmp_path / "goals.json")])
    builds = [b for b in ("native", "x86-64-v3") if decode_build.runs_here(b)]
    parts = {(r["part"], r["build"], r["form"]) for r in result["rows"]}
    for b in builds:
        assert {("read share", b, f) for f in ("contiguous", "paged 16", "paged 64", script.BANDWIDTH)} <= parts
        assert ("int8 attention alone", b, "int8 cache") in parts
    assert ("int8 module step", "native", "int8 cache") in parts
    assert {t["isa"] for t in result["targets"]} == {decode_build.variant(b)[0].isa() for b in builds}
    assert result["machine"]["cpu_flags"] and result["machine"]["load_average"] is not None
    assert json.loads((tmp_path / "goals.json").read_text())["targets"] == result["targets"]


def test_the_committed_goals_name_the_isa_and_the_load_of_their_run():
    result = json.loads((BENCH / "decode-goals.json").read_text())
    isas = {t["isa"] for t in result["targets"]}
    assert any(i.startswith("avx512") for i in isas) and "avx2" in isas
    assert result["machine"]["load_average"] and result["load_average_at_end"]
    for t in result["targets"]:
        assert t["verdict"] == ("met" if (t["value"] <= t["goal"] if "drift" in t["target"] else t["value"] >= t["goal"])
                                else "MISSED"), t
