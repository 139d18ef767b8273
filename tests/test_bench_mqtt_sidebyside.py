"""Smoke test for bench/mqtt_sidebyside.py: topiary's MQTT port beside Mosquitto, tiny sizes.

topiary-mqtt always runs; Mosquitto runs when installed (``apt-get install mosquitto``) and
its row says "not installed" when it is not. Only the report's shape and exactness facts are
checked, never timings.
"""

from __future__ import annotations

import copy
import subprocess

import pytest

from bench import mqtt_sidebyside, sidebyside
from bench.harness import peers
from tests.benchrun import ROOT, run_quick
from tests.test_bench_sidebyside import check_result

SCRIPT = ROOT / "bench" / "mqtt_sidebyside.py"
MOSQUITTO = peers.installed("mosquitto")
SIZE, MESSAGES = 1_000, 2_000


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    path = tmp_path_factory.mktemp("bench") / "mqtt_sidebyside.json"
    return run_quick(SCRIPT, path, "--sizes", str(SIZE), "--messages", str(MESSAGES))


def test_topiary_mqtt_is_exact_one_copy_per_connection(tiny_run: tuple) -> None:
    _, report = tiny_run
    assert report["benchmark"] == "mqtt_sidebyside"
    params = report["parameters"]
    assert params["ours"] == "topiary-mqtt" and params["quick"] is True
    assert params["brokers"] == ["topiary-mqtt", "mosquitto"]
    result = report["sizes"][str(SIZE)]["topiary-mqtt"]
    check_result(result, SIZE, MESSAGES)
    assert result["delivery"] == "connection"
    assert result["broker_stop"]["exit_status"] == 0
    assert result["broker_log_summary"]["problem_count"] == 0
    for phase in ("throughput", "latency"):  # topiary's counters, read on its native port
        counters = result[phase]["broker_counters"]
        assert counters["dropped"] == 0 and counters["slow_consumer_disconnects"] == 0
        assert counters["messages_in"] >= result[phase]["messages"]


def test_mosquitto_beside_it_or_a_row_that_says_why_not(tiny_run: tuple) -> None:
    proc, report = tiny_run
    by_kind = report["sizes"][str(SIZE)]
    assert list(by_kind) == ["topiary-mqtt", "mosquitto"]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith(" 1,000 ")]
    assert [row[1] for row in rows] == ["topiary-mqtt", "mosquitto"]
    if not MOSQUITTO:
        assert by_kind["mosquitto"]["installed"] is False
        assert "mosquitto: not installed (apt-get install mosquitto)" in proc.stdout
        assert report["ratios"][str(SIZE)] == {}
        return
    check_result(by_kind["mosquitto"], SIZE, MESSAGES)
    ours = by_kind["topiary-mqtt"]["throughput"]["exactness"]["received"]
    assert by_kind["mosquitto"]["throughput"]["exactness"]["received"] == ours
    ratio = report["ratios"][str(SIZE)]["mosquitto"]
    assert ratio["completion"] > 0 and ratio["p99"] > 0 and ratio["completion_comparable"]
    assert rows[1][6].endswith("x")  # topiary-mqtt / mosquitto on Mosquitto's row
    assert "not installed" not in proc.stdout


def test_goals_are_issue_17s(tiny_run: tuple) -> None:
    _, report = tiny_run
    goals = report["goals"]
    assert [g["goal"].split(":")[0] for g in goals[:3]] == ["S = 1,000", "S = 10,000", "S = 1,000"]
    assert "1.5x Mosquitto" in goals[0]["goal"] and "p99" in goals[2]["goal"]
    assert all(g["status"] == "not measured" for g in goals[:-1])  # a quick run never judges
    assert goals[-1]["goal"].startswith("every topiary-mqtt delivery exact")
    assert goals[-1]["status"] == "PASS"


def test_a_missing_mosquitto_is_said_in_the_table(tiny_run: tuple) -> None:
    _, real = tiny_run
    report = copy.deepcopy(real)
    missing = {"kind": "mosquitto", "size": SIZE, "installed": False}
    report["sizes"][str(SIZE)]["mosquitto"] = missing
    report["ratios"] = {
        s: sidebyside.ratios(k, mqtt_sidebyside.OURS) for s, k in report["sizes"].items()
    }
    assert report["ratios"][str(SIZE)] == {}
    lines = sidebyside.table_lines(report)
    assert "mosquitto: not installed (apt-get install mosquitto)" in lines
    row = next(line for line in lines if line.split()[1:2] == ["mosquitto"])
    assert "not installed" in row
    goals = mqtt_sidebyside.check_goals(report)
    assert all(g["status"] == "not measured" for g in goals[:-1])
