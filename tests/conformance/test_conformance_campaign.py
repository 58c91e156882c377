"""campaign.py, the long random run, works end to end: a CI-sized run of both slices by default, or the size
MULTIHEAD_CAMPAIGN names (MULTIHEAD_CAMPAIGN=10000: 10,000 short configurations and 200 long ones per backend)."""
from __future__ import annotations

import os

from tests.conformance import campaign
from tests.conformance.long_cases import LONG_BACKENDS

CI_SIZES = (12, 2)  # short configurations, long ones per backend


def test_a_campaign_with_its_long_slice_passes_and_every_long_backend_runs_its_calls(capsys):
    short, long = campaign.sizes() if "MULTIHEAD_CAMPAIGN" in os.environ else CI_SIZES
    assert campaign.main(["--configs", str(short), "--long", str(long), "--start", "101"]) == 0
    summary = capsys.readouterr().out
    assert f"{short} short configurations and {long} long ones per backend" in summary and "0 unexplained" in summary
    long_line = next(line for line in summary.splitlines() if "long slice:" in line)
    assert all(f"{backend} {long}" in long_line for backend in LONG_BACKENDS), long_line  # each ran every call
