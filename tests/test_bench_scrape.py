"""Smoke test for bench/scrape.py: both variants run side by side, the scraped broker really
was scraped (Prometheus' parser reads what it got), the table shows the ratio."""

from __future__ import annotations

import subprocess

import pytest

from tests.benchrun import ROOT, run_quick, still_running

SCENARIOS = ("fanout-50", "wild-1k")
OURS = (b"broker.cli", b"multiprocessing", b"scrape")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(ROOT / "bench" / "scrape.py", tmp_path_factory.mktemp("bench") / "s.json")


def test_quick_run_compares_plain_and_scraped_brokers(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "scrape"
    assert report["parameters"]["quick"] is True and report["parameters"]["rounds"] == 1
    runs = {(r["name"], r["variant"]): r for r in report["runs"]}
    assert set(runs) == {(n, v) for n in SCENARIOS for v in ("plain", "scraped")}
    for (name, variant), run in runs.items():
        assert "error" not in run, run["error"]
        assert run["throughput"]["complete"] and run["throughput"]["delivered_per_second"] > 0
        assert run["throughput"]["missing"] == run["throughput"]["dropped"]
        assert ("scrape" in run) == (variant == "scraped"), (name, variant)
    for name in SCENARIOS:
        scrape = runs[(name, "scraped")]["scrape"]
        assert scrape["scrapes"] >= 2 and scrape["ok"] == scrape["scrapes"], scrape
        assert scrape["errors"] == []
        assert scrape["bytes_last"] > 0 and scrape["last_families"] > 0
        assert 0 < scrape["ms_p50"] <= scrape["ms_max"]
        assert scrape["broker_cpu_ms_per_scrape"] >= 0 and 0 <= scrape["cpu_share"] < 1
        comparison = report["comparison"][name]
        assert comparison["implied_ratio"] is not None
        assert comparison["ratio"] == pytest.approx(
            comparison["scraped_delivered_per_second"] / comparison["plain_delivered_per_second"]
        )
    assert [g["status"] in ("PASS", "FAIL") for g in report["goals"]] == [True] * 2 * len(SCENARIOS)


def test_quick_run_leaves_no_process_behind(quick_run: tuple) -> None:
    _, report = quick_run
    for run in report["runs"]:
        pids = [run["broker_pid"], *run["worker_pids"]]
        if run["variant"] == "scraped":
            pids.append(run["alongside"]["pid"])
        for pid in pids:
            assert not still_running(pid, *OURS), (run["name"], run["variant"], pid)
        assert run["broker_stop"]["killed"] is False
        assert run["broker_stop"]["exit_status"] == 0


def test_quick_run_prints_both_runs_and_the_ratio(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("scenario"))
    for column in ("variant", "delivered/s", "p99 ms", "scrapes", "scrape ms"):
        assert column in lines[header]
    rows = [line.split()[:2] for line in lines[header + 2 : header + 6]]
    assert sorted(rows) == sorted([n, v] for n in SCENARIOS for v in ("plain", "scraped"))
    ratio = next(i for i, line in enumerate(lines) if "ratio" in line and i > header)
    assert [line.split()[0] for line in lines[ratio + 2 : ratio + 4]] == list(SCENARIOS)
    assert sum(line.startswith("check") for line in lines) == 2 * len(SCENARIOS)
