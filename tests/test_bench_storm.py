"""Smoke test for bench/storm.py: the quick run in a subprocess, so the benchmark cannot rot.

The topiary run always happens; a tiny run against Mosquitto and nats-server happens when
they are installed (``apt-get install mosquitto nats-server``), and its test says so when
they are not. Only the report's shape and exactness facts are checked, never timings.
"""

from __future__ import annotations

import copy
import subprocess

import pytest

from bench import storm
from bench.harness import peers
from tests.benchrun import ROOT, run_quick, still_running

SCRIPT = ROOT / "bench" / "storm.py"
QUICK_STORM = 5_000
PEERS = [kind for kind in ("mosquitto", "nats") if peers.installed(kind)]
OURS = (b"broker.cli", b"multiprocessing", b"mosquitto", b"nats-server")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(
        SCRIPT, tmp_path_factory.mktemp("bench") / "storm.json", "--brokers", "topiary"
    )


@pytest.fixture(scope="module")
def peer_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    if not PEERS:
        pytest.skip(f"neither mosquitto nor nats-server is installed ({peers.INSTALL_HINT})")
    return run_quick(
        SCRIPT,
        tmp_path_factory.mktemp("bench") / "storm-peers.json",
        "--brokers", ",".join(PEERS), "--rate", "2000", "--storm-filters", "2000",
    )  # fmt: skip


def check_broker_result(result: dict, storm_filters: int) -> None:
    """What every broker's column must show, whatever the timings."""
    assert result["installed"] is True
    assert "error" not in result, result["error"]
    assert result["bystanders_subscribed"] == 1_000 + 4  # the control topic on each
    for key in ("subscribe", "unsubscribe"):
        timing = result["storm"][key]
        assert timing["count"] == storm_filters and timing["refused"] == 0
        assert timing["seconds"] > 0
    assert result["storm"]["received"] == 0  # its filters name sites the traffic never does
    latency = result["latency_ms"]
    assert set(latency) == {"outside", "storm", "after"}
    for phase in ("outside", "storm", "after"):
        for basis in ("send", "schedule"):
            figures = latency[phase][basis]
            assert figures["samples"] > 0, (phase, basis)
            assert 0 <= figures["p50"] <= figures["p99"] <= figures["max"]
    exact = result["exactness"]
    assert exact["exact"] is True, exact
    assert exact["missing"] == exact["duplicates"] == exact["unexpected"] == 0
    assert exact["received"] == exact["expected"] > 0
    assert len(exact["connections"]) == 4
    assert all(row["error"] is None for row in exact["connections"])
    samples = sum(latency[phase]["send"]["samples"] for phase in latency)
    assert samples <= exact["received"]  # the settling start is not measured
    publisher = result["publisher"]
    assert publisher["sent"] > 0 and publisher["achieved_rate"] > 0
    assert publisher["stopped_by"] == "told"
    assert result["broker_peak_rss_mb"] > 0 and result["broker_cpu_seconds"] >= 0
    assert result["broker_stop"]["killed"] is False
    for pid in [result["broker_pid"], *result["worker_pids"]]:
        assert not still_running(pid, *OURS), pid


def test_quick_run_on_topiary(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "storm"
    assert {"machine", "parameters", "plan", "brokers", "goals", "notes"} <= report.keys()
    params = report["parameters"]
    assert params["quick"] is True and params["storm_filters"] == QUICK_STORM
    assert params["brokers"] == ["topiary"]
    plan = report["plan"]
    assert plan["bystander_filters"]["kept"] == 1_000
    assert plan["bystander_filters"]["dropped"] > 0  # prefix wildcards are not portable
    assert plan["storm_filters"]["kept"] == QUICK_STORM and plan["storm_matching_topics"] == 0
    assert list(report["brokers"]) == ["topiary"]
    result = report["brokers"]["topiary"]
    check_broker_result(result, QUICK_STORM)
    assert result["delivery"] == "connection"
    stats = result["broker_stats"]
    assert stats["dropped"] == 0 and stats["slow_consumer_disconnects"] == 0
    assert stats["subscribes"] == stats["unsubscribes"] == QUICK_STORM
    assert stats["table_entries_after"] == stats["table_entries_before"]
    assert result["broker_stop"]["exit_status"] == 0
    assert result["broker_log_summary"]["problem_count"] == 0
    goals = {g["goal"]: g for g in report["goals"]}
    assert goals["every bystander delivery exact"]["status"] == "PASS"
    assert {g["status"] for g in report["goals"]} <= {"PASS", "FAIL", "not measured"}
    # A quick run is not judged on timings.
    assert all(g["status"] == "not measured" for g in report["goals"][:-1])


def test_quick_run_prints_one_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.rstrip().endswith("goal (topiary)"))
    assert lines[header].split()[0] == "topiary"
    rows = [line for line in lines[header + 2 :] if line.strip()]
    for label in ("storm subscribe s", "storm unsubscribe s", "during storm", "outside storm"):
        assert any(row.startswith(label) for row in rows), label
    assert any(row.startswith("exact") and " yes " in f"{row} " for row in rows)
    assert any(line.startswith("check") for line in lines)


def test_a_missing_broker_is_a_column_that_says_so(quick_run: tuple) -> None:
    _, real = quick_run
    report = copy.deepcopy(real)
    report["brokers"]["mosquitto"] = {"kind": "mosquitto", "installed": False}
    report["brokers"]["nats"] = {"kind": "nats", "installed": False}
    lines = storm.table_lines(report)
    subscribe = next(line for line in lines if line.startswith("storm subscribe s"))
    assert subscribe.count("not installed") == 2
    assert any(line.startswith("not installed: mosquitto, nats") for line in lines)
    goals = {g["goal"]: g["status"] for g in storm.check_goals(report)}
    ratio = next(goal for goal in goals if "Mosquitto" in goal)
    assert goals[ratio] == "not measured"
    assert any("mosquitto: not installed" in note for note in storm.notes(report))


def test_tiny_run_on_the_installed_peers(peer_run: tuple) -> None:
    proc, report = peer_run
    assert list(report["brokers"]) == PEERS
    for kind in PEERS:
        result = report["brokers"][kind]
        check_broker_result(result, 2_000)
        assert result["delivery"] == peers.DELIVERY[kind]
        assert result["version"]
    header = next(line for line in proc.stdout.splitlines() if line.endswith("goal (topiary)"))
    assert header.split()[: len(PEERS)] == PEERS
