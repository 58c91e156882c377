"""`multihead bench` end to end on tiny sizes: every suite runs, reports, plots. No timing asserted."""
from __future__ import annotations

import io
import json
from pathlib import Path
import os

import pytest
import torch

from multihead.bench import cli, memory, report
from multihead.bench.peers import FLOOR_VARIANTS, Shape
from multihead.bench.registry import build, names
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites import decode, latent, padded, parallel, roofline, scaling, shootout, small
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare

TINY = {
    shootout: shootout.Sizes(Shape(batch=2, length=16, embed=32, heads=4)),
    scaling: scaling.Sizes((32,), embed=32, heads=4, memory_budget=1),  # textbook over budget
    padded: padded.Sizes(length=64, batch=4, heads=2, head_dim=8),
    roofline: roofline.Sizes(gemm=64, copy_mib=1, length=64, heads=2, head_dim=8),
    small: small.Sizes(Shape(batch=1, length=8, embed=32, heads=4), calls=2),
    decode: decode.Sizes(contexts=(16,), heads=4, kv_heads=2, head_dim=8, ragged_batch=2, ragged_longest=16,
                         window=4, window_length=16, window_heads=2, window_head_dim=8, rotation_mib=1),
    parallel: parallel.Sizes(32, heads=2, head_dim=8, world_sizes=(1, 2)),
    latent: latent.Sizes(context=8, hidden=32, heads=2, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=2,
                         v_head_dim=4, gqa_kv_heads=1, dtypes=("fp32",)),
}


def test_cli_runs_every_suite_and_writes_json_markdown_and_plots(tmp_path, monkeypatch, capsys):
    for suite, sizes in TINY.items():
        monkeypatch.setattr(suite.Sizes, "quick", classmethod(lambda cls, s=sizes: s))
    parser = __import__("argparse").ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(["--quick", "--rounds", "1", "--no-progress", "--json", str(tmp_path / "r.json"),
                              "--markdown", str(tmp_path / "r.md"), "--plot", str(tmp_path / "plots")])
    assert cli.main(args) == 0
    captured = capsys.readouterr()
    stdout = captured.out
    data = json.loads((tmp_path / "r.json").read_text())
    assert not any(ln.startswith("{") for ln in stdout.splitlines()), "the JSON goes to stdout only with --json"
    assert str(tmp_path / "r.json") in captured.err
    assert max(len(ln) for ln in stdout.splitlines()) <= report.PIPED_WIDTH, "piped: the tables fit 100 columns"
    assert set(data["suites"]) == set(cli.SUITES) - set(cli.ASKED_FOR)  # loops: only when named
    assert "ours[sdpa]" in stdout  # names with brackets are printed as text, not as rich markup
    assert data["machine"]["threads"] == torch.get_num_threads() and data["machine"]["clock"] == "wall"
    shoot = data["suites"]["shootout"]
    assert {r["implementation"] for r in shoot["rows"]} == set(names())
    assert next(r for r in shoot["rows"] if r["implementation"] == "ours")["forward x ours"] == 1.0
    floor_target = next(t for t in shoot["targets"] if t["name"] == "P1 forward: ours / floor")
    assert any(f"floor = {v}," in floor_target["note"] for v in FLOOR_VARIANTS)
    for row in shoot["rows"]:  # the runs column comes from the dispatcher: SDPA inside ours and the floors
        assert ("SDPA CPU flash" in row["runs"]) == (row["implementation"].startswith(("ours", "floor"))
                                                     or "need_weights=False" in row["implementation"])
    assert all(t["met"] is None for t in data["suites"]["scaling"]["targets"])  # P2 needs N=32768
    skipped = data["suites"]["scaling"]["rows"][0]
    assert skipped["ours peak MiB"] > 0 and "not run: predicted" in skipped["note"]
    assert {t["name"] for t in data["suites"]["small"]["targets"]} >= {
        "small causal: ours attention() / raw SDPA", "small key padding: ours module / floor module"}
    ours_padded = [r for r in data["suites"]["padded"]["rows"] if r["implementation"] == "ours"]
    assert {r["backend"] for r in ours_padded} == {"sdpa"}  # too small for varlen to pay off
    assert all(r["max |diff| vs dense"] < 1e-5 for r in data["suites"]["padded"]["rows"]
               if r["max |diff| vs dense"] is not None)
    par = data["suites"]["parallel"]
    assert {(r["P"], r["method"]) for r in par["rows"]} == {(1, "one process"), (1, "ring"), (1, "ulysses"),
                                                            (2, "ring"), (2, "ulysses")}
    assert all(r["counted / model"] == 1.0 for r in par["rows"] if r["P"] == 2)
    assert "### Targets" in (tmp_path / "r.md").read_text()
    assert sorted(p.name for p in (tmp_path / "plots").iterdir()) == sorted(f"{s}.png" for s in cli.SUITES
                                                                         if s not in cli.ASKED_FOR)


def test_every_peer_computes_the_same_shape_forward_and_backward():
    shape = Shape(batch=2, length=8, embed=16, heads=2)
    for name in names():
        runner = build(name, shape)
        out = runner.forward()
        runner.forward_backward()
        assert out.shape in ((2, 8, 16), (8, 2, 16)), name  # document 003 is sequence-first
        assert all(p.grad is not None for p in runner.params), name


@pytest.mark.parametrize("variant", FLOOR_VARIANTS)
def test_every_floor_variant_agrees_with_ours_given_the_same_weights(variant):
    shape = Shape(batch=2, length=8, embed=16, heads=2)
    ours, floor = build("ours", shape), build(variant, shape)
    theirs, mine = floor.module, ours.module
    with torch.no_grad():
        if theirs.fused_qkv:
            theirs.qkv.weight.copy_(torch.cat([mine.q_proj.weight, mine.k_proj.weight, mine.v_proj.weight]))
            theirs.qkv.bias.copy_(torch.cat([mine.q_proj.bias, mine.k_proj.bias, mine.v_proj.bias]))
        else:
            for name in ("q_proj", "k_proj", "v_proj"):
                getattr(theirs, name).load_state_dict(getattr(mine, name).state_dict())
        theirs.out_proj.load_state_dict(mine.out_proj.state_dict())
    torch.testing.assert_close(ours.forward(), floor.forward(), atol=1e-5, rtol=1e-5)
    q, k, v = theirs.split(shape.input())
    assert all(t.is_contiguous() == theirs.contiguous for t in (q, k, v))


def test_probe_reports_peak_rss_of_a_fresh_process():
    found = memory.probe("ours", Shape(batch=1, length=16, embed=16, heads=2), repeats=2, warmup=1)
    assert found["peak_rss"] >= found["setup_rss"] > 0 and found["seconds"] > 0
    assert "error" in memory.probe("no such peer", Shape(1, 4, 4, 1))


def test_predicted_score_memory_follows_4_n2_h():
    shape = Shape(batch=1, length=1024, embed=512, heads=8)
    assert memory.score_tensor_bytes(shape) == 4 * 1024**2 * 8
    assert scaling.predicted_bytes(shape) == 2 * 4 * 1024**2 * 8 + 1024**2


def test_compare_interleaves_and_takes_medians():
    calls = []
    t = compare({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b", "b", "a", "a", "b"]  # warm-up, then rounds in rotated order
    assert len(t["a"].samples) == 3 and t["a"].median_s == sorted(t["a"].samples)[1]


def test_targets_and_cells_render():
    from multihead.bench.results import Target

    assert Target("x", 1.0, "<=", 1.05).met and not Target("x", 2.0, "<=", 1.05).met
    assert Target("x", None, ">=", 1).met is None
    assert report.cell("forward x ours", 1.234) == "1.23x" and report.cell("ms", None) == "-"
    assert report.target_cells(Target("x", 0.5, ">=", 1.6))[3] == "MISSED"


def one_suite(monkeypatch, tmp_path, *argv):
    """cli.main on the tiny `small` suite alone with `argv`; (exit code, captured stdout and stderr)."""
    monkeypatch.setattr(small.Sizes, "quick", classmethod(lambda cls: TINY[small]))
    monkeypatch.chdir(tmp_path)   # so that a file written unasked would show
    parser = __import__("argparse").ArgumentParser()
    cli.configure(parser)
    return cli.main(parser.parse_args(["--suite", "small", "--quick", "--rounds", "1", "--no-progress", *argv]))


def test_the_json_line_goes_to_stdout_only_with_json(monkeypatch, tmp_path, capsys):
    import tempfile
    before = set(Path(tempfile.gettempdir()).glob("multihead-bench*"))
    assert one_suite(monkeypatch, tmp_path) == 0
    out, err = capsys.readouterr()
    assert "{" not in out and "--json PATH" in err
    assert "multihead bench: took" in err and "(--quick)" in err, "the run says how long it really took"
    assert not list(tmp_path.iterdir()), "nothing is written unasked"
    assert set(Path(tempfile.gettempdir()).glob("multihead-bench*")) == before
    assert one_suite(monkeypatch, tmp_path, "--json", str(tmp_path / "every.json")) == 0
    assert "small" in json.loads((tmp_path / "every.json").read_text())["suites"]
    assert one_suite(monkeypatch, tmp_path, "--json") == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert "small" in json.loads(line)["suites"]


def test_tables_fit_the_terminal_and_never_exceed_200_columns(monkeypatch):
    monkeypatch.setattr(report.shutil, "get_terminal_size", lambda fallback: os.terminal_size((300, 50)))
    assert report.table_width(is_terminal=False) == 100 and report.table_width(is_terminal=True) == 200
    monkeypatch.setattr(report.shutil, "get_terminal_size", lambda fallback: os.terminal_size((90, 50)))
    assert report.table_width(is_terminal=True) == 90


def busy_machine(clock: str = "wall", start=(3.9, 2.0, 1.0), end=(4.5, 3.0, 1.5)) -> dict:
    return {"cpu": "test cpu", "cores": 4, "threads": 1, "torch": torch.__version__, "date": "today",
            "clock": clock, "load_average_at_start": start, "load_average": end}


def test_a_busy_machine_is_measured_explained_and_pointed_at_the_cpu_clock():
    from rich.console import Console

    assert report.busy_share(busy_machine()) == pytest.approx(3.9 / 4)
    assert report.busy_share(busy_machine(start=(0.1, 0, 0), end=(1.2, 0, 0))) == pytest.approx(0.2 / 4)
    assert report.load_note(busy_machine(start=(0.5, 0, 0), end=(2.0, 0, 0))) is None, "our own thread is no load"
    assert report.busy_share(busy_machine(start=None, end=None)) is None
    note = report.load_note(busy_machine())
    assert "busy" in note and "98%" in note and "4 cores" in note and "--clock cpu" in note and "MISSED" in note
    assert "--clock cpu" not in report.load_note(busy_machine(clock="cpu"))
    assert "wanted 2.2 times as many cores as it has (4)" in report.load_note(busy_machine(start=(8.8, 0, 0)))
    console = Console(width=100, record=True, file=io.StringIO())
    result = SuiteResult("s", "a table", ["implementation", "ms"], [{"implementation": "ours", "ms": 1.5}],
                         [Target("t", 2.0, "<=", 1.0)])
    report.print_rich([result], busy_machine(), console)
    text = console.export_text()
    assert "MISSED" in text and "--clock cpu" in text and max(map(len, text.splitlines())) <= 100


@pytest.mark.parametrize("bad", (["--suite", "nope"], ["--threads", "two"], ["--clock", "gpu"]))
def test_cli_rejects_bad_arguments(bad):
    parser = __import__("argparse").ArgumentParser()
    cli.configure(parser)
    with pytest.raises(SystemExit):
        parser.parse_args(bad)


def test_machine_description_says_what_ran_where():
    from multihead.bench import machine

    info = machine.describe()
    assert info["torch"] == torch.__version__ and info["threads"] == torch.get_num_threads()
    assert info["cpu"] and info["date"].endswith("UTC")
    assert set(info["cpu_flags"].split()) <= set(machine.ISA_FLAGS) and "decode_isa" in info


def test_the_cpu_s_vector_isa_is_read_from_cpuinfo():
    from multihead.bench import machine

    x86 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw avx512_bf16\n"
    assert machine.cpu_flags(x86) == "avx512f avx512_bf16 avx2 fma"
    assert machine.cpu_flags("Features\t: fp asimd evtstrm sve\n") == "asimd sve"
    assert machine.cpu_flags("model name\t: unknown\n") == ""


def test_the_decode_kernel_s_isa_is_what_its_loaded_build_reports(monkeypatch):
    from multihead.bench import machine

    monkeypatch.setattr(machine.decode_build, "loaded", lambda: type("Built", (), {"isa": staticmethod(lambda: "avx2")}))
    assert machine.decode_isa() == "avx2"
    monkeypatch.setattr(machine.decode_build, "loaded", lambda: None)
    assert machine.decode_isa() is None


def test_flop_convention_and_padded_lengths():
    assert roofline.attention_flops(1, 8, 4096, 4096, 64, causal=False) == 4 * 8 * 4096**2 * 64
    assert roofline.attention_flops(2, 8, 16, 16, 64, causal=True) == 2 * 2 * 8 * 16**2 * 64
    assert padded.valid_lengths(padded.Sizes(4096)).tolist() == [512 * i for i in range(1, 9)]


def test_set_threads_sets_and_reports():
    from multihead.bench.timing import set_threads

    before = torch.get_num_threads()
    try:
        assert set_threads(1) == 1 and set_threads(None) == 1
    finally:
        torch.set_num_threads(before)


def test_progress_bars_go_to_stderr_only(capsys):
    from multihead.bench.progress import Bars

    with Bars(enabled=True) as bars, bars.task("work", total=3) as steps:
        steps.advance()
        steps.describe("more work")
    captured = capsys.readouterr()
    assert captured.out == "" and "more work" in captured.err


def test_ratio_pairs_rounds_so_a_slow_round_cancels():
    from multihead.bench.timing import Timing, ratio

    a, b = Timing(2.0, (1.0, 2.0, 20.0)), Timing(1.0, (0.5, 1.0, 10.0))  # round 3 ran under load
    assert ratio(a, b) == 2.0
    assert ratio(a, Timing(4.0, (4.0,))) == 0.5  # unpaired: ratio of medians


def test_fastest_variant_of_each_family_has_the_lowest_median():
    from multihead.bench.peers import fastest_variants
    from multihead.bench.timing import Timing

    t = {"ours": Timing(2.0, (2.0,)), "floor[a]": Timing(3.0, (3.0,)), "floor[b]": Timing(1.0, (1.0,)),
         "nn.MultiheadAttention[x]": Timing(5.0, (5.0,)), "000 Book": Timing(4.0, (4.0,))}
    assert fastest_variants(t) == {"ours": "ours", "floor": "floor[b]", "nn.MultiheadAttention":
                                   "nn.MultiheadAttention[x]", "000 Book": "000 Book"}


def test_ratio_range_spans_the_per_round_ratios():
    from multihead.bench.timing import Timing, ratio_range

    assert ratio_range(Timing(2.0, (1.0, 2.0, 6.0)), Timing(1.0, (1.0, 1.0, 2.0))) == (1.0, 3.0)


def test_what_runs_reports_the_kernels_the_dispatcher_sees():
    from multihead.bench.kernels import what_runs

    shape = Shape(batch=2, length=8, embed=16, heads=2)
    assert what_runs(build("floor[fused QKV, views]", shape).forward) == "2 GEMMs + SDPA CPU flash"
    assert what_runs(build("002 ClassicTransformerHeads", shape).forward) == "4 GEMMs + N^2 scores (bmm + softmax)"
    fast_path = build("nn.MultiheadAttention[need_weights=False, eval]", shape).what_runs()
    assert fast_path.startswith("forward: torch's native MHA kernel; fwd+bwd: ") and "SDPA" in fast_path
    assert what_runs(lambda: None) == "no attention kernel seen"


@pytest.mark.parametrize("pad_queries", (False, True))
def test_dense_baselines_compute_what_ours_computes(pad_queries):
    import multihead as mh

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 12, 8, generator=g) for _ in range(3))  # (B, H, N, D)
    lens = torch.tensor([4, 9, 12])
    mask = mh.Mask.lengths(lens, query_lens=lens if pad_queries else None)
    expected = mh.attention(q.double(), k.double(), v.double(), mask, backend="math").float()
    for name, call in padded.dense_baselines(q, k, v, lens, pad_queries).items():
        torch.testing.assert_close(call(), expected, atol=1e-5, rtol=1e-5, msg=name)


def test_the_cpu_clock_does_not_count_time_spent_off_the_cpu():
    import time

    from multihead.bench.timing import clock, set_clock, time_call

    try:
        assert set_clock("wall") == "wall" and time_call(lambda: time.sleep(0.05)) >= 0.05
        assert set_clock("cpu") == clock() == "cpu" and time_call(lambda: time.sleep(0.05)) < 0.05
        with pytest.raises(ValueError, match="clock must be one of"):
            set_clock("gpu")
        assert clock() == "cpu"  # a refused clock leaves the one in use
    finally:
        set_clock("wall")


def test_probe_runs_with_the_parents_clock_and_threads(monkeypatch):
    from multihead.bench.timing import set_clock

    seen = {}

    def fake_run(cmd, **kwargs):
        seen.update(json.loads(cmd[-1]))
        raise __import__("subprocess").TimeoutExpired(cmd, 1)

    monkeypatch.setattr(memory.subprocess, "run", fake_run)
    before = torch.get_num_threads()
    try:
        set_clock("cpu")
        torch.set_num_threads(1)
        assert "error" in memory.probe("ours", Shape(batch=1, length=4, embed=4, heads=1))
    finally:
        set_clock("wall")
        torch.set_num_threads(before)
    assert seen["clock"] == "cpu" and seen["threads"] == 1
