"""The hot-spare benchmark's smoke run: both setups measured, the pair confirmed with its
standby in sync (nothing confirmed alone), and the ratio is what the two rows say; one
kill -9 of the primary timed, and the durable session holds every confirmed message."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchrun import ROOT, run_quick


def test_quick_ha_benchmark_measures_a_single_broker_and_a_synced_pair(tmp_path: Path) -> None:
    proc, report = run_quick(
        ROOT / "bench" / "ha.py", tmp_path / "ha.json", "--tasks", "16", "--kills", "1"
    )
    assert report["benchmark"] == "ha"
    assert report["single_per_second"] > 0 and report["pair_per_second"] > 0
    assert report["pair_confirms_alone"] == 0 and report["pair_confirms_waited"] > 0
    ratio = report["pair_per_second"] / report["single_per_second"]
    assert report["ratio"] == pytest.approx(ratio)
    assert "pair, sync = true" in proc.stdout
    assert report["kills"] == 1 and len(report["failover_seconds"]) == 1
    assert 0 < report["failover_p50"] == report["failover_max"] < 30
    assert report["failover_confirmed"] > 0 and report["failover_missing"] == 0
    assert "failover over 1 kill -9" in proc.stdout
