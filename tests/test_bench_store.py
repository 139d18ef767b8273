"""The store benchmark's smoke run: it runs, and its JSON says what the table says."""

from __future__ import annotations

from pathlib import Path

from tests.benchrun import ROOT, run_quick


def test_quick_store_benchmark_reports_appends_and_a_complete_replay(tmp_path: Path) -> None:
    proc, report = run_quick(ROOT / "bench" / "store.py", tmp_path / "store.json")
    assert report["benchmark"] == "store"
    assert report["replay_complete_and_in_order"] is True
    cases = {(row["case"], row.get("concurrency")) for row in report["results"]}
    assert {("append", 1), ("append", 10), ("append", 100)} <= cases
    for row in report["results"]:
        assert row["per_second"] > 0
    grouped = [r for r in report["results"] if r["case"] == "append" and r["concurrency"] == 100]
    assert grouped[0]["mean_batch"] > 1  # group commit really groups
    assert "confirmed appends/s" in proc.stdout
