"""campaign.py, the long random run, works end to end on a few configurations (the CI-sized version of it)."""
from __future__ import annotations

from tests.conformance import campaign


def test_a_short_campaign_passes_and_reports(capsys):
    assert campaign.main(["--configs", "12", "--start", "101"]) == 0
    summary = capsys.readouterr().out
    assert "12 configurations" in summary and "0 unexplained" in summary
