"""Smoke test for bench/routing_churn.py: it runs at its ``--quick`` size in a subprocess,
and its JSON has the promised shape and says the cache stayed correct (timings are not
judged here)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

from bench import routing_churn, workload  # noqa: E402
from tests.benchrun import run_quick  # noqa: E402

SCRIPT = ROOT / "bench" / "routing_churn.py"
RATES = [
    f"{phase}_{what}_per_{clock}"
    for phase in ("cold", "warm")
    for what in ("subscribe", "unsubscribe")
    for clock in ("second", "wall_second")
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "routing_churn.json")


def test_quick_run_writes_one_row_with_every_rate(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "routing_churn"
    assert {"python", "platform", "cpu_count"} <= report["machine"].keys()
    assert report["parameters"]["quick"] is True
    assert report["parameters"]["counts"] == routing_churn.QUICK
    (row,) = report["results"]
    assert row["size"] == 1000 and row["n_sites"] == workload.scaled_sites(1000)
    assert row["cached_topics"] == routing_churn.QUICK["cached_topics"]
    assert row["ops"] == routing_churn.QUICK["ops"]  # no loop ran out of time
    for key in RATES:
        assert isinstance(row[key], float) and row[key] > 0, key
    assert row["broad_subscribe_ms"] > 0 and row["broad_unsubscribe_ms"] > 0
    assert len(row["rounds"]) == routing_churn.QUICK["rounds"]
    assert {g["status"] for g in report["goals"]} <= {"PASS", "FAIL", "not measured"}
    assert [g["status"] for g in report["goals"]][2:] == ["not measured"] * 2  # no S=100k


def test_quick_run_answers_stay_exact_through_the_churn(quick_run: tuple) -> None:
    _, report = quick_run
    (row,) = report["results"]
    assert report["correct"] is True and row["correct"] is True
    assert row["stale_after_subscribe"] == 0 and row["stale_after_broad"] == 0
    assert row["changed_after_unsubscribe"] == 0 and row["changed_after_broad"] == 0
    assert row["answers_with_fresh"] > 0  # the fresh filters did reach cached topics
    assert row["check_hits"] == row["cached_topics"]  # the check read cached answers


def test_quick_run_keeps_the_cache_warm(quick_run: tuple) -> None:
    _, report = quick_run
    (row,) = report["results"]
    assert row["warm_invalidated"] > 0  # cached answers did change ...
    assert row["rewarm_passes"] == 0 and row["rewarm_misses"] == 0  # ... and none was lost
    assert row["warm_clears"] == 0
    (round_,) = row["rounds"]
    assert round_["broad_invalidated"] > row["cached_topics"]  # `beacon/#` alone reaches all


def test_quick_run_prints_a_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["S"])
    for column in ("sub/s cold", "sub/s warm", "unsub/s cold", "unsub/s warm", "correct"):
        assert column in lines[header]
    assert set(lines[header + 1]) <= {"-", " "}
    row = lines[header + 2].split()
    assert row[0] == "1000" and row[-1] == "yes"
    assert any("warm sub/s at S=1,000" in line for line in lines)
