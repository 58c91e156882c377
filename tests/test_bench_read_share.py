"""The decode suite's read share divides by one bandwidth for the whole run, so that no share rests on a
part whose own bandwidth rounds came out low (benchmarks/decode.md once quoted such a share)."""
from __future__ import annotations

import pytest

from multihead.bench.results import SuiteResult
from multihead.bench.suites import read_share as rs
from multihead.bench.timing import Timing

BW = "read bandwidth: sum of 256 MiB fp32"
BIG = 256 * 2**20


def part(case: str, bandwidth_s: float, ours_s: float, rows_at: int = 0, targets_at: int = 0) -> rs.Part:
    """A part whose bandwidth sum() took `bandwidth_s` and whose every attention row took `ours_s`, two rounds."""
    same = {name: Timing(ours_s, (ours_s, ours_s)) for name in (rs.OURS, rs.PLAIN, rs.KERNEL, rs.RAW, rs.GROUPED)}
    more = {2: {rs.OURS: Timing(ours_s / 2, (ours_s / 2,) * 2), BW: Timing(bandwidth_s / 2, (bandwidth_s / 2,) * 2)}}
    return rs.Part(case, 32 * 2**20, BIG, BW, {**same, BW: Timing(bandwidth_s, (bandwidth_s, bandwidth_s))}, more,
                   {}, "decode", "C++ decode kernel", rows_at, targets_at)


def test_one_bandwidth_for_the_run_is_the_median_of_every_part_s_rounds():
    parts = [part("decode N=1024 fp32: attention", 0.0068, 0.001), part("decode N=4096 fp32: attention", 0.0080, 0.001),
             part("decode N=16384 fp32: attention", 0.0069, 0.001)]
    rate, rounds = rs.run_bandwidth(parts)
    assert rounds == 6 and rate == pytest.approx(BIG / 0.0069)
    assert rs.run_bandwidth(parts, 2)[0] == pytest.approx(BIG / 0.00345)


def test_a_part_with_a_slow_bandwidth_round_gets_the_run_s_denominator_and_is_named():
    # each part's place, counted in the table as it was when the part ran (the rows "a", "b", "c" came after)
    parts = [part("decode N=1024 fp32: attention", 0.0068, 0.002, 1, 0),
             part("decode N=4096 fp32: attention", 0.0080, 0.002, 2, 0),  # its own bandwidth 14% low
             part("decode N=16384 fp32: attention", 0.0069, 0.002, 3, 0)]
    result = SuiteResult("decode", "t", [], rows=[{"case": "before"}, {"case": "a"}, {"case": "b"}, {"case": "c"}])
    rs.report(parts, result)
    shares = [t.value for t in result.targets]
    assert shares == pytest.approx([32 * 2**20 / 0.002 / (BIG / 0.0069)] * 3)  # the same time, the same share
    assert [t.name for t in result.targets] == [
        f"decode N={n} fp32: attention reads K/V at this share of the read bandwidth" for n in (1024, 4096, 16384)]
    cases = [r["case"] for r in result.rows]
    assert cases[0] == "before" and cases[1:8] == ["decode N=1024 fp32: attention"] * 7 and cases[8] == "a"
    assert cases[9:16] == ["decode N=4096 fp32: attention"] * 7 and cases[16] == "b" and cases[-1] == "c"
    own = next(r for r in result.rows if r["case"] == "decode N=4096 fp32: attention" and r["implementation"].startswith(BW))
    assert own["% of bandwidth"] == pytest.approx(100 * 0.0069 / 0.0080)
    [note] = result.notes
    assert "one for the whole run, 38.9 GB/s" in note and "more than 10% off the run's: decode N=4096 fp32 (33.6 GB/s, -14%)" in note
    assert "this part's rounds 33.6 GB/s" in result.targets[1].note
