"""Smoke test for bench/mqtt_replay.py: the MQTT port's in-process replay, tiny sizes. Only
the report's shape and its delivery facts are checked, never timings."""

from __future__ import annotations

from pathlib import Path

from bench import mqtt_replay
from tests.benchrun import ROOT, run_quick

SCRIPT = ROOT / "bench" / "mqtt_replay.py"


def test_the_replay_delivers_what_the_filters_owe_in_both_shapes(tmp_path: Path) -> None:
    proc, report = run_quick(SCRIPT, tmp_path / "mqtt_replay.json")
    assert report["benchmark"] == "mqtt_replay"
    assert report["parameters"]["quick"] is True
    rows = {row["shape"]: row for row in report["rows"]}
    assert set(rows) == {"throughput", "latency"}
    assert rows["latency"]["reads"] == rows["latency"]["messages"] // mqtt_replay.LATENCY_PER_READ
    assert rows["throughput"]["reads"] < rows["throughput"]["messages"] // 100  # 256 KiB reads
    for row in rows.values():
        assert row["size"] == 1_000 and row["level"] == 4
        assert row["deliveries"] > row["messages"]  # (the script checks them one by one)
        assert row["bytes_sent"] > row["deliveries"] * 200  # payloads of 200-800 B went out
        assert row["us_per_message_min"] > 0
    assert "| 1,000 | latency |" in proc.stdout
