"""Smoke test for bench/memory.py: the quick run in a subprocess, so the benchmark cannot rot.

It starts real brokers and a worker process on 127.0.0.1 (a few seconds). The figures
are checked for shape and sanity, not against the goals: a shared CI machine is no place
to hold RSS to a byte count.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchrun import run_quick

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "memory.py"
SCENARIOS = ("idle", "idle-sub", "filters-1", "filters-spread")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "memory.json")


def test_quick_run_measures_every_scenario(quick_run: tuple) -> None:
    done, report = quick_run
    assert {"benchmark", "machine", "parameters", "scenarios", "goals", "peers"} <= report.keys()
    params = report["parameters"]
    assert params["quick"] is True
    assert params["nofile"]["soft"] >= params["connections"]
    assert set(report["scenarios"]) == set(SCENARIOS)
    for name in SCENARIOS:
        r = report["scenarios"][name]
        assert "error" not in r, r["error"]
        # every connection was welcomed, every filter acknowledged and held by the broker
        assert r["welcomed"] == r["connections"]
        assert r["subacks"] == r["filters"]
        assert r["errors"] == []
        added = r["table_after"]["entries"] - r["table_before"]["entries"]
        assert added == r["filters"], name
        assert r["subscriptions"] == r["filters"]
        assert r["rss_after_kib"] > r["rss_before_kib"] > 0
        assert r["hwm_kib"] >= r["rss_after_kib"]
        assert r["rss_delta_kib"] == r["rss_after_kib"] - r["rss_before_kib"]
        assert r["broker_stop"]["killed"] is False
        assert r["broker_log_summary"]["problem_count"] == 0
    assert report["scenarios"]["idle"]["connections"] == params["connections"]
    assert report["scenarios"]["idle"]["filters"] == 0
    assert report["scenarios"]["filters-1"]["connections"] == 1
    assert report["scenarios"]["filters-spread"]["connections"] == params["spread"]
    assert report["scenarios"]["filters-1"]["filters"] == params["filters"]
    # an idle connection costs something, and less than a megabyte
    assert 0 < report["scenarios"]["idle"]["per_connection_bytes"] < 1 << 20
    for name in ("filters-1", "filters-spread"):
        assert 0 < report["scenarios"][name]["per_filter_bytes"] < 1 << 16
        assert "per_filter_net_bytes" in report["scenarios"][name]
    assert "per_subscription_net_bytes" in report["scenarios"]["idle-sub"]
    assert set(report["peers"]) == {"mosquitto", "nats-server"}
    assert [g["status"] for g in report["goals"]][:1] != ["not measured"]
    assert "per idle connection" in done.stdout or "per conn" in done.stdout


def test_breakdown_labels_what_connections_and_filters_hold(tmp_path: Path) -> None:
    """bench/memory_breakdown.py at a tiny count: the census finds the broker's objects."""
    out = tmp_path / "breakdown.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "memory_breakdown.py"), "--connections", "20",
         "--filters", "300", "--spread", "3", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    idle = report["idle"]["labels"]
    assert idle["broker.ClientConnection"][0] == 20  # (count, bytes)
    assert "trio Task" in idle
    assert report["idle"]["tasks"]
    filters = report["filters"]["labels"]
    assert filters["routing.Filter"][0] == 300
    assert "per idle connection (20)" in done.stdout
