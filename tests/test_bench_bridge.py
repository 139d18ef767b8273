"""Smoke test for bench/bridge.py: the quick run in a subprocess, so the benchmark cannot rot.

It starts Tansu, three brokers and three bridges on 127.0.0.1 (a few seconds, most of it the
bridges' consumer group joins) and checks that both paths counted exactly.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.benchrun import ROOT, run_quick, still_running

pytest.importorskip("confluent_kafka")

from bridges.tansu import TansuUnavailable, tansu_binary

SCRIPT = ROOT / "bench" / "bridge.py"
EVENTS = 3_000
# 4 partitions of 750 records: offsets 0..748 regular (site s{offset % 100}) + a sentinel
# (site s00) at 749. s00: 8 per partition + the sentinel; s0*: 80 per partition + it.
WANTED = {"1%": 36, "10%": 324, "100%": EVENTS}
FILTERS = {"1%": "beacon/*/*/s00/>", "10%": "beacon/*/*/s0*/>", "100%": "beacon/>"}


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    try:
        tansu_binary()
    except TansuUnavailable as exc:
        pytest.skip(f"Tansu is unavailable: {exc}")
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "bridge.json")


OURS = (b"broker.cli", b"tansu")  # what the run starts


def test_quick_run_counts_exactly_on_both_paths(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "bridge"
    assert {"python", "platform", "cpu_count", "librdkafka"} <= report["machine"].keys()
    params = report["parameters"]
    assert params["quick"] is True and params["events"] == EVENTS
    assert params["filters"] == FILTERS
    assert sum(report["produce"]["log_end"]) == EVENTS
    assert set(report["runs"]) == set(WANTED)
    for label, wanted in WANTED.items():
        run = report["runs"][label]
        assert run["problems"] == [], (label, run["problems"])
        assert run["wanted"] == wanted, label
        bridge, flat = run["bridge"], run["flat"]
        assert bridge["expected"] == bridge["delivered"] == wanted, label
        assert bridge["duplicates"] == bridge["missing"] == bridge["unexpected"] == 0, label
        assert bridge["wrong_topic"] == 0 and bridge["subscriber_error"] is None, label
        assert bridge["broker_messages_in"] == wanted, label  # nothing unwanted published
        assert bridge["moved_per_wanted"] == 1.0 and bridge["broker_in_per_wanted"] == 1.0
        counters = bridge["bridge_counters"]
        assert counters["records_in"] == EVENTS and counters["published"] == wanted, label
        assert counters["unwanted_dropped"] == EVENTS - wanted and counters["malformed"] == 0
        assert bridge["bridge_stop"]["exit_status"] == 0, (label, bridge["bridge_stop"])
        assert bridge["bridge_stop"]["killed"] is False, label
        assert 0 < bridge["first_delivery_seconds"] < 60, label
        assert flat["read"] == EVENTS and flat["kept"] == wanted, label
        assert flat["moved_per_wanted"] == round(EVENTS / wanted, 4), label
        # A quick run can deliver everything in one read (no window to divide by).
        for rate in (bridge.get("events_per_second"), flat.get("events_per_second")):
            assert rate is None or rate > 0, label


def test_quick_run_reports_goals_and_prints_a_table(quick_run: tuple) -> None:
    proc, report = quick_run
    goals = {g["goal"]: g for g in report["goals"]}
    for label in WANTED:
        assert goals[f"exact counts, {label} wanted"]["status"] == "PASS"
        assert goals[f"bridge moves <= 1.05 messages per wanted, {label} wanted"]["status"] == (
            "PASS"
        )
    for text in ("bridge ev/s", "flat ev/s", "moved/wanted", "beacon/*/*/s0*/>", "CPU share"):
        assert text in proc.stdout, text


def test_quick_run_leaves_no_process_behind(quick_run: tuple) -> None:
    _, report = quick_run
    pids = [report["tansu_pid"]]
    for run in report["runs"].values():
        pids += [run["bridge"]["broker_pid"], run["bridge"]["bridge_pid"]]
    assert len(pids) == 7
    for pid in pids:
        assert not still_running(pid, *OURS), pid
