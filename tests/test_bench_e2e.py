"""Smoke test for bench/e2e.py: the quick run in a subprocess, so the benchmark cannot rot.

It starts real brokers and worker processes on 127.0.0.1, so it takes some seconds.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.benchrun import run_quick, still_running

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "bench" / "e2e.py"

PUBLISH_SCENARIOS = ("exact", "wild-1k", "wild-10k", "fanout-50")
SUBSCRIBE_SCENARIO = "subscribe-50k"
DURABLE_SCENARIOS = ("durable-confirm", "durable-batch", "durable-replay")
GOAL_SCENARIOS = ("durable-confirm", "durable-replay")  # durable-batch is an extra row
QUICK_REPLAY_COUNT = 10_000


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "e2e.json")


OURS = (b"broker.cli", b"multiprocessing", b"e2e")  # what the run starts


def test_quick_run_writes_every_scenario(quick_run: tuple) -> None:
    _, report = quick_run
    assert {"benchmark", "machine", "parameters", "scenarios", "goals", "notes"} <= report.keys()
    assert {"python", "platform", "cpu_count"} <= report["machine"].keys()
    assert report["parameters"]["quick"] is True
    assert report["parameters"]["payload_size"] == 500
    assert set(report["scenarios"]) == {*PUBLISH_SCENARIOS, SUBSCRIBE_SCENARIO, *DURABLE_SCENARIOS}
    for name in PUBLISH_SCENARIOS:
        result = report["scenarios"][name]
        assert "error" not in result, result["error"]
        assert result["subscribed"] == result["subscriptions"] + result["connections"]
        for phase in ("throughput", "latency"):
            figures = result[phase]
            assert figures["complete"] is True, (name, phase)
            assert figures["published"] > 0
            assert figures["published_per_second"] > 0
            assert figures["delivered_per_second"] > 0
            assert figures["received"] > 0
            # Every expected delivery arrived or was counted as dropped by the broker.
            assert figures["missing"] == figures["dropped"] >= 0, (name, phase)
        latency = result["latency"]["latency_ms"]
        assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
        assert result["latency"]["latency_samples"] == result["latency"]["received"]
        assert result["broker_rss_mb"] > 0
    assert report["scenarios"]["exact"]["throughput"]["deliveries_per_message"] == 1
    assert report["scenarios"]["fanout-50"]["connections"] == 50
    assert report["scenarios"]["fanout-50"]["throughput"]["deliveries_per_message"] == 50
    sub = report["scenarios"][SUBSCRIBE_SCENARIO]
    assert "error" not in sub, sub["error"]
    assert sub["subscribe_seconds"] > 0 and sub["subscribes_per_second"] > 0
    assert sub["unsubscribe_seconds"] > 0 and sub["unsubscribes_per_second"] > 0
    assert sub["subscribe_errors"] == sub["unsubscribe_errors"] == 0
    assert sub["broker_subscribes"] == sub["broker_unsubscribes"] == sub["count"]
    assert sub["table_entries_after"] == sub["table_entries_before"]  # every UNSUB took
    assert {g["status"] for g in report["goals"]} <= {"PASS", "FAIL", "not measured"}
    goals = " ".join(g["goal"] for g in report["goals"])
    for name in GOAL_SCENARIOS:
        assert name in goals
    assert "durable-batch" not in goals  # a pipelined publisher does not count for issue 4


def test_quick_run_durable_scenarios(quick_run: tuple) -> None:
    _, report = quick_run
    for name in DURABLE_SCENARIOS:
        result = report["scenarios"][name]
        assert "error" not in result, result["error"]
        got = result["subscriber"]
        assert got["error"] is None, (name, got["error"])
        assert result["first_session_present"] is False  # a fresh data dir per scenario
        assert result["received"] > 0
        assert result["missing"] == 0, name
        # Every message in seq order from 1, no gaps, the marker last, all of it acked.
        assert result["in_order"] is True, (name, got)
        assert got["first_seq"] == 1 and got["gaps"] == got["backwards"] == got["late"] == 0
        assert got["last_seq"] == got["done_seq"] == result["received"] + 1
        assert got["last_acked"] == got["last_seq"]
        assert result["broker"]["store_errors"] == 0
        assert result["broker"]["errors"] == {}
        assert result["broker_rss_mb"] > 0
        assert result["data_dir_filesystem"]
        stored = result["store_after_stop"]
        assert stored["deliveries"] == 0 and stored["last_ack"] == got["last_seq"], stored
        assert result["data_dir_removed"] is True
        assert not os.path.exists(result["data_dir"])
    confirm = report["scenarios"]["durable-confirm"]
    assert confirm["confirmed"] > 0 and confirm["confirmed_per_second"] > 0
    assert confirm["publish_errors"] == 0
    assert confirm["received"] == confirm["confirmed"]
    assert confirm["tasks"] == report["parameters"]["durable_tasks"] > 1
    latency = confirm["confirm_latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    batch = report["scenarios"]["durable-batch"]
    assert batch["confirmed"] > 0 and batch["publish_errors"] == 0
    assert batch["received"] == batch["confirmed"]
    assert batch["confirmed"] % batch["batch_size"] == 0
    assert batch["tasks"] * batch["batch_size"] == report["parameters"]["durable_tasks"]
    replay = report["scenarios"]["durable-replay"]
    assert replay["count"] == replay["stored"] == replay["received"] == QUICK_REPLAY_COUNT
    assert replay["replayed_per_second"] > 0 and replay["stored_per_second"] > 0
    assert replay["session_present"] is True
    assert replay["detached"] is True
    # Everything came from the store: the broker replayed all of it, the marker too.
    assert replay["broker"]["messages_replayed"] == QUICK_REPLAY_COUNT + 1
    assert replay["fill_broker"]["messages_in"] == QUICK_REPLAY_COUNT + 1


def test_quick_run_leaves_no_process_behind(quick_run: tuple) -> None:
    _, report = quick_run
    for name, result in report["scenarios"].items():
        pids = [result["broker_pid"], *result.get("worker_pids", [])]
        for pid in pids:
            assert not still_running(pid, *OURS), (name, pid)
        assert result["broker_stop"]["killed"] is False
        assert result["broker_stop"]["exit_status"] == 0
        assert os.path.basename(result["broker_log"]).startswith(name)


def test_quick_run_prints_a_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("scenario"))
    for column in ("published/s", "delivered/s", "p50 ms", "p99 ms", "max ms", "RSS MB"):
        assert column in lines[header]
    assert "dropped" in lines[header]
    rows = [line.split()[0] for line in lines[header + 2 : header + 2 + len(PUBLISH_SCENARIOS)]]
    assert rows == list(PUBLISH_SCENARIOS)
    assert any(line.startswith(SUBSCRIBE_SCENARIO) for line in lines)
    durable = next(i for i, line in enumerate(lines) if line.startswith("durable "))
    for column in ("rate/s", "p50 ms", "p99 ms", "received", "missing", "in order"):
        assert column in lines[durable]
    rows = [line.split()[0] for line in lines[durable + 2 : durable + 2 + len(DURABLE_SCENARIOS)]]
    assert rows == list(DURABLE_SCENARIOS)
    assert all("failed" not in line for line in lines[durable + 2 : durable + 5])
    assert any(line.startswith("check") for line in lines)
