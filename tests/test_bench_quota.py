"""The quota benchmark's smoke run: a broker whose away durable session is at its limit
(drop-oldest) and one below it, measured in ABBA rounds; each confirmed publish at quota
drops exactly one stored message, none below it."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from tests.benchrun import ROOT, run_quick


def test_quick_quota_benchmark_compares_a_session_at_its_limit_with_one_below(
    tmp_path: Path,
) -> None:
    proc, report = run_quick(ROOT / "bench" / "quota.py", tmp_path / "quota.json")
    assert report["benchmark"] == "quota" and report["rounds"] == 2
    at_quota, below = report["rows"]
    assert (at_quota["setup"], below["setup"]) == ("at quota", "below quota")
    assert at_quota["max_messages"] == 1000 and below["max_messages"] > 10**8
    for row in report["rows"]:
        assert len(row["rates"]) == 2 and all(rate > 0 for rate in row["rates"])
        assert row["confirmed"] > 0 and row["cpu_us"] > 0
    assert at_quota["quota_dropped"] == at_quota["confirmed"]  # one oldest per new message
    assert below["quota_dropped"] == 0
    assert report["drops_exact"] is True
    ratios = [a / b for a, b in zip(at_quota["rates"], below["rates"], strict=True)]
    assert report["ratios"] == pytest.approx(ratios)
    assert report["ratio"] == pytest.approx(statistics.median(ratios))
    assert "drops exact (one per confirmed publish at quota, none below): yes" in proc.stdout
