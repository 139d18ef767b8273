"""The hot-spare benchmark's smoke run: both setups up together and measured in ABBA rounds
of short phases (a rate per round and setup, a ratio per round, medians, the peak), the pair
confirmed with its standby in sync (nothing confirmed alone), the idle setup's CPU reported;
one kill -9 of the primary timed, and the durable session holds every confirmed message."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from tests.benchrun import ROOT, run_quick


def test_quick_ha_benchmark_interleaves_a_single_broker_and_a_synced_pair(tmp_path: Path) -> None:
    proc, report = run_quick(
        ROOT / "bench" / "ha.py", tmp_path / "ha.json", "--tasks", "16,32", "--kills", "1"
    )
    assert report["benchmark"] == "ha" and report["method"] == "interleaved"
    assert report["rounds"] == 2 and report["task_counts"] == [16, 32]
    assert set(report["by_tasks"]) == {"16", "32"}
    for row in report["by_tasks"].values():
        assert len(row["single_rates"]) == len(row["pair_rates"]) == len(row["ratios"]) == 2
        assert all(rate > 0 for rate in row["single_rates"] + row["pair_rates"])
        ratios = [p / s for p, s in zip(row["pair_rates"], row["single_rates"], strict=True)]
        assert row["ratios"] == pytest.approx(ratios)
        assert row["ratio"] == pytest.approx(statistics.median(ratios))
        assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"]
        interval = row["ratio_interval"]  # 2 rounds: the min-max, 50% confidence
        assert (interval["low"], interval["high"]) == (row["ratio_min"], row["ratio_max"])
        assert interval["coverage"] == pytest.approx(0.5)
        assert row["single_per_second"] == pytest.approx(statistics.median(row["single_rates"]))
        assert row["pair_per_second"] == pytest.approx(statistics.median(row["pair_rates"]))
        assert row["confirms_alone"] == 0 and row["confirms_waited"] > 0
        assert set(row["single_cpu_us"]) == {"broker", "publisher"}
        assert set(row["pair_cpu_us"]) == {"primary", "standby", "publisher"}
        assert row["idle_pair_cpu_percent"] >= 0 and row["idle_single_cpu_percent"] >= 0
    assert report["ratio"] == report["by_tasks"]["16"]["ratio"]  # the first number: top level
    peak = report["peak"]
    rows = report["by_tasks"]
    assert peak["single_per_second"] == max(r["single_per_second"] for r in rows.values())
    assert peak["pair_per_second"] == max(r["pair_per_second"] for r in rows.values())
    best_single = rows[str(peak["single_tasks"])]["single_rates"]
    best_pair = rows[str(peak["pair_tasks"])]["pair_rates"]
    peak_ratios = [p / s for p, s in zip(best_pair, best_single, strict=True)]
    assert peak["ratio"] == pytest.approx(statistics.median(peak_ratios))
    assert report["goals"]["ratio_at_128"] is None  # 128 not measured here
    assert report["goals"]["peak_ratio_met"] == (peak["ratio"] >= 0.75)
    assert report["pair_confirms_alone"] == 0 and report["pair_confirms_waited"] > 0
    assert report["single_quota_dropped"] == report["pair_quota_dropped"] == 0
    assert "goal peak ratio >= 0.75" in proc.stdout and "ratios by round" in proc.stdout
    assert report["kills"] == 1 and len(report["failover_seconds"]) == 1
    assert 0 < report["failover_p50"] == report["failover_max"] < 30
    assert report["failover_confirmed"] > 0 and report["failover_missing"] == 0
    assert "failover over 1 kill -9" in proc.stdout


@pytest.mark.parametrize(
    ("rounds", "rank", "coverage"),
    [(2, 1, 0.5), (5, 1, 0.9375), (6, 1, 0.96875), (8, 1, 0.9922), (9, 2, 0.9609), (12, 3, 0.9614)],
)
def test_the_median_interval_is_the_widest_rank_pair_with_95_percent_or_the_min_max(
    rounds: int, rank: int, coverage: float
) -> None:
    from bench.ha import _median_interval

    values = [float(v) for v in range(rounds, 0, -1)]  # any order: sorted inside
    interval = _median_interval(values)
    assert interval == pytest.approx(
        {"low": float(rank), "high": float(rounds + 1 - rank), "coverage": coverage}, abs=1e-4
    )


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to set one apart")
def test_cpu_options_pin_every_thread_of_each_process_where_asked(tmp_path: Path) -> None:
    *brokers, apart = sorted(os.sched_getaffinity(0))  # the highest CPU for the standby
    _, report = run_quick(
        ROOT / "bench" / "ha.py", tmp_path / "ha.json", "--tasks", "16", "--kills", "0",
        "--latency", "0", "--standby-cpus", str(apart), "--publisher-cpus", str(apart),
    )  # fmt: skip
    assert report["cpus"] == {"brokers": brokers, "standby": [apart], "publishers": [apart]}
    affinity = report["affinity"]
    assert affinity["single"] == affinity["primary"] == brokers
    assert affinity["standby"] == affinity["single_publisher"] == affinity["pair_publisher"]
    assert affinity["standby"] == [apart]
    assert report["by_tasks"]["16"]["confirms_alone"] == 0


def test_a_placement_names_every_cpu_kind_and_leaves_the_brokers_the_rest() -> None:
    from bench.ha import Placement

    allowed = frozenset({0, 1, 2, 3})
    assert Placement.choose(allowed) == Placement()  # no option: nothing pinned
    only_standby = Placement.choose(allowed, standby=frozenset({3}))
    assert only_standby == Placement(frozenset({0, 1, 2}), frozenset({3}), frozenset({0, 1, 2}))
    both = Placement.choose(allowed, standby=frozenset({3}), publishers=frozenset({2}))
    assert both == Placement(frozenset({0, 1}), frozenset({3}), frozenset({2}))
    with pytest.raises(ValueError, match="for the standby are not available"):
        Placement.choose(allowed, standby=frozenset({7}))
    with pytest.raises(ValueError, match="no CPU left for the brokers"):
        Placement.choose(allowed, standby=frozenset({0, 1}), publishers=frozenset({2, 3}))


def test_cpu_options_that_leave_nothing_for_the_brokers_are_refused() -> None:
    every = ",".join(str(cpu) for cpu in sorted(os.sched_getaffinity(0)))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ha.py"), "--standby-cpus", every],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "no CPU left for the brokers" in proc.stderr
