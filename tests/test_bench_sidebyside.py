"""Smoke test for bench/sidebyside.py: the quick run in a subprocess, so the benchmark cannot rot.

The topiary run always happens; a tiny run against Mosquitto and nats-server happens when
they are installed (``apt-get install mosquitto nats-server``), and its test says so when
they are not. Only the report's shape and exactness facts are checked, never timings.
"""

from __future__ import annotations

import copy
import subprocess

import pytest

from bench import sidebyside
from bench.harness import peers
from tests.benchrun import ROOT, run_quick, still_running

SCRIPT = ROOT / "bench" / "sidebyside.py"
QUICK_MESSAGES = 4_000
PEERS = [kind for kind in ("mosquitto", "nats") if peers.installed(kind)]
OURS = (b"broker.cli", b"multiprocessing", b"mosquitto", b"nats-server")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    path = tmp_path_factory.mktemp("bench") / "sidebyside.json"
    return run_quick(SCRIPT, path, "--brokers", "topiary")


@pytest.fixture(scope="module")
def peer_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    if not PEERS:
        pytest.skip(f"neither mosquitto nor nats-server is installed ({peers.INSTALL_HINT})")
    return run_quick(
        SCRIPT,
        tmp_path_factory.mktemp("bench") / "sidebyside-peers.json",
        "--brokers", ",".join(["topiary", *PEERS]), "--sizes", "1000", "--messages", "2000",
    )  # fmt: skip


def check_result(result: dict, size: int, messages: int) -> None:
    """What every row must show, whatever the timings."""
    assert result["installed"] is True
    assert "error" not in result, result["error"]
    assert result["subscribed"] == size + 4  # the control topic on each connection
    tput = result["throughput"]
    assert tput["messages"] == messages
    assert tput["complete"] is True
    assert tput["completion_seconds"] > 0 and tput["completion_per_second"] > 0
    assert tput["published_per_second"] > 0 and tput["delivered_per_second"] > 0
    per_message = tput["deliveries_per_message"]
    assert per_message >= 1  # `beacon/>` is among the filters: every message goes somewhere
    lat = result["latency"]
    assert lat["complete"] is True and lat["messages"] > 0
    for key in ("latency_ms", "from_schedule_ms"):
        figures = lat[key]
        assert figures["samples"] == lat["exactness"]["received"]
        assert 0 <= figures["p50"] <= figures["p99"] <= figures["max"]
    sched = lat["broker_scheduling"]  # /proc/PID/schedstat over the latency phase
    assert sched["run_ms"] > 0 and sched["wait_ms"] >= 0 and sched["preempted"] >= 0
    for phase in (tput, lat):
        exact = phase["exactness"]
        assert exact["exact"] is True, exact
        assert exact["missing"] == exact["duplicates"] == exact["unexpected"] == 0
        assert exact["received"] == exact["expected"] > 0
        assert len(exact["connections"]) == 4
    assert result["broker_peak_rss_mb"] > 0
    assert result["broker_stop"]["killed"] is False
    assert result["subscriber_errors"] == []
    for pid in [result["broker_pid"], *result["worker_pids"]]:
        assert not still_running(pid, *OURS), pid


def test_quick_run_on_topiary(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "sidebyside"
    assert {"machine", "parameters", "filters", "sizes", "ratios", "goals", "notes"} <= set(report)
    params = report["parameters"]
    assert params["quick"] is True and params["messages"] == QUICK_MESSAGES
    assert params["sizes"] == [1_000, 10_000] and params["brokers"] == ["topiary"]
    assert params["payload_sizes"] == [200, 800]
    for size in ("1000", "10000"):
        drawn = report["filters"][size]
        assert drawn["kept"] == int(size)
        assert drawn["dropped"] > 0 and drawn["mapped"] > 0
        assert list(report["sizes"][size]) == ["topiary"]
        result = report["sizes"][size]["topiary"]
        check_result(result, int(size), QUICK_MESSAGES)
        assert result["broker_stop"]["exit_status"] == 0
        assert result["broker_log_summary"]["problem_count"] == 0
        for phase in ("throughput", "latency"):
            counters = result[phase]["broker_counters"]
            assert counters["dropped"] == 0 and counters["slow_consumer_disconnects"] == 0
        assert report["ratios"][size] == {}  # nobody to compare with
    goals = report["goals"]
    assert goals[-1]["status"] == "PASS"  # every topiary delivery exact
    assert all(g["status"] == "not measured" for g in goals[:-1])


def test_quick_run_prints_one_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["S", "broker"])
    for column in ("published/s", "delivered/s", "complete s", "top/peer", "p99 ms", "exact tput"):
        assert column in lines[header]
    rows = [line.split() for line in lines[header + 2 : header + 4]]
    assert [row[:2] for row in rows] == [["1,000", "topiary"], ["10,000", "topiary"]]
    assert all(row[-4:-2] == ["yes", "yes"] for row in rows)


def test_a_missing_broker_is_a_row_that_says_so(quick_run: tuple) -> None:
    _, real = quick_run
    report = copy.deepcopy(real)
    for by_kind in report["sizes"].values():
        by_kind["nats"] = {"kind": "nats", "size": 1000, "installed": False}
    report["ratios"] = {s: sidebyside.ratios(k) for s, k in report["sizes"].items()}
    assert report["ratios"]["1000"] == {}  # a missing peer has no ratio
    lines = sidebyside.table_lines(report)
    missing = [line for line in lines if "not installed" in line]
    assert len(missing) == 3 and all(line.split()[1] == "nats" for line in missing[:2])
    assert missing[2] == "nats: not installed (apt-get install nats-server)"  # once, below
    assert any("nats: not installed" in note for note in sidebyside.notes(report))


def test_tiny_run_beside_the_installed_peers(peer_run: tuple) -> None:
    proc, report = peer_run
    by_kind = report["sizes"]["1000"]
    assert list(by_kind) == ["topiary", *PEERS]
    for kind, result in by_kind.items():
        check_result(result, 1_000, 2_000)
        assert result["delivery"] == peers.DELIVERY[kind]
    ours = by_kind["topiary"]["throughput"]["exactness"]["received"]
    for kind in PEERS:
        theirs = by_kind[kind]["throughput"]["exactness"]["received"]
        if peers.DELIVERY[kind] == "connection":
            assert theirs == ours  # the same copies, message by message
        else:
            assert theirs >= ours  # one per matching filter
        ratio = report["ratios"]["1000"][kind]
        assert ratio["completion"] > 0 and ratio["p99"] > 0
        assert ratio["completion_comparable"] is True
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(" 1,000 ")]
    assert [row[1] for row in rows] == ["topiary", *PEERS]
    assert all(row[6].endswith("x") for row in rows[1:])  # the ratio columns are filled
