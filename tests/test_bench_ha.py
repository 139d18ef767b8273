"""The hot-spare benchmark's smoke run: both setups measured, the pair confirmed with its
standby in sync (nothing confirmed alone), and the ratio is what the two rows say."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.benchrun import ROOT, run_quick


def test_quick_ha_benchmark_measures_a_single_broker_and_a_synced_pair(tmp_path: Path) -> None:
    proc, report = run_quick(ROOT / "bench" / "ha.py", tmp_path / "ha.json", "--tasks", "16")
    assert report["benchmark"] == "ha"
    assert report["single_per_second"] > 0 and report["pair_per_second"] > 0
    assert report["pair_confirms_alone"] == 0 and report["pair_confirms_waited"] > 0
    ratio = report["pair_per_second"] / report["single_per_second"]
    assert report["ratio"] == pytest.approx(ratio)
    assert "pair, sync = true" in proc.stdout
