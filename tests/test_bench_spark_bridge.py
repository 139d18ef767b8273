"""Smoke test for bench/spark_bridge.py: the quick run in a subprocess, so the benchmark
cannot rot.

The run itself is conftest.spark_bench_quick_run: when in-process Spark tests run in the
same session, it runs alongside them (conftest.pytest_collection_modifyitems says why). It
starts Tansu, two brokers, the plain bridge and one Spark driver (local[2]) on 127.0.0.1
(~25 s, most of it the JVM and the SparkSession starting) and checks that both pipelines
delivered exactly the expected events in both phases and left nothing running. A quick run
keeps the driver's class cache off: writing the archive would add ~10 s at the driver's exit
(test_spark_classcache.py has a real JVM write and map one).
"""

from __future__ import annotations

import subprocess

import pytest

from tests.benchrun import ROOT, QuickRun, still_running

pytest.importorskip("confluent_kafka")

EVENTS = 3_000
LIVE = 1_000  # 1,000/s for 1 s
# 4 partitions of 750 records: offsets 0..748 regular (site s{offset % 100}) and a sentinel
# (site s00) at 749, so s0* wants 80 + 1 per partition. The live records go on at offsets
# 750..999 of each partition: s0* wants 800..809 and 900..909.
WANTED_BACKLOG = 324
WANTED_LIVE = 80
RUNS = {"plain-10": ("plain", None), "table-10": ("spark", "table")}


@pytest.fixture(scope="module")
def quick_run(spark_bench_quick_run: QuickRun | str) -> tuple[subprocess.CompletedProcess, dict]:
    """The run conftest.spark_bench_quick_run started, alongside the in-process Spark tests
    when they run too."""
    if isinstance(spark_bench_quick_run, str):
        pytest.skip(spark_bench_quick_run)
    return spark_bench_quick_run.result()


OURS = (b"broker.cli", b"tansu", b"pyspark")  # what the run starts


def test_quick_run_counts_exactly_in_both_phases(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "spark_bridge"
    assert {"python", "cpu_count", "pyspark", "java"} <= report["machine"].keys()
    params = report["parameters"]
    assert params["quick"] is True and params["events"] == EVENTS
    assert params["master"] == "local[2]" and params["max_offsets"] == 1_000
    assert list(report["runs"]) == list(RUNS)
    for name, (pipeline, mode) in RUNS.items():
        run = report["runs"][name]
        assert run["problems"] == [], (name, run["problems"])
        assert (run["pipeline"], run["filter_mode"], run["label"]) == (pipeline, mode, "10%")
        assert run["wanted_backlog"] == WANTED_BACKLOG and run["wanted_live"] == WANTED_LIVE
        exact = run["exact"]
        assert exact["expected"] == exact["delivered"] == WANTED_BACKLOG + WANTED_LIVE, name
        assert exact["duplicates"] == exact["missing"] == exact["unexpected"] == 0, name
        assert exact["wrong_topic"] == exact["extra_bytes_after"] == 0, name
        assert exact["broker_messages_in"] == WANTED_BACKLOG + WANTED_LIVE, name
        assert run["pipeline_stop"]["exit_status"] == 0, (name, run["pipeline_stop"])
        assert run["pipeline_stop"]["killed"] is False, name
        assert run["live_produce"]["records"] == LIVE, name
        latency = run["latency"]
        assert latency["count"] == WANTED_LIVE, name
        assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["max_ms"], name
        assert 0 < run["throughput"]["first_batch_seconds"] < 120, name


def test_spark_run_has_a_steady_window_and_query_progress(quick_run: tuple) -> None:
    _, report = quick_run
    run = report["runs"]["table-10"]
    throughput = run["throughput"]
    # The first micro-batch holds the first 1,000 records; two more follow.
    assert throughput["first_batch_records"] == 1_000
    assert throughput["steady_events"] == EVENTS - 1_000
    assert throughput["steady_events_per_second"] > 0
    assert {"jvm", "py_tasks", "py_other", "driver", "broker", "machine"} <= throughput[
        "cpu_share"
    ].keys()
    progress = run["spark_progress"]
    assert progress["first_batch_rows"] == 1_000 and progress["backlog_batches"] == 3
    assert progress["steady_ms_per_batch"]["addBatch"] > 0
    assert run["spark_stopped"], "the driver logged no 'spark bridge stopped'"


def test_a_quick_run_keeps_the_class_cache_out_of_it(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["parameters"]["class_cache"] == ""
    assert report["runs"]["table-10"]["class_cache"] == "off"


def test_quick_run_reports_goals_and_prints_a_table(quick_run: tuple) -> None:
    proc, report = quick_run
    goals = {g["goal"]: g for g in report["goals"]}
    for name in RUNS:
        assert goals[f"exact counts, {name}"]["status"] == "PASS"
    assert goals["Spark >= 25,000 events/s steady, table-10"]["status"] == "not measured"
    for text in ("steady ev/s", "1st batch s", "p99 ms", "table-10", "CPU over the steady"):
        assert text in proc.stdout, text


def test_quick_run_leaves_no_process_behind(quick_run: tuple) -> None:
    _, report = quick_run
    pids = [report["tansu_pid"]]
    for run in report["runs"].values():
        pids += [run["broker_pid"], run["pipeline_pid"], *run["pipeline_tree"]]
    assert len(report["runs"]["table-10"]["pipeline_tree"]) >= 3  # driver, JVM, workers
    for pid in pids:
        assert not still_running(pid, *OURS), pid


def test_a_full_run_uses_the_bridges_default_batch_size_and_small_runs_a_quarter() -> None:
    import sys

    if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
        sys.path.insert(0, str(ROOT))
    from bench import spark_bridge
    from bridges.config import SparkSettings

    default = SparkSettings().max_offsets_per_trigger
    assert spark_bridge.FULL["max_offsets"] == default
    assert spark_bridge.max_offsets(spark_bridge.RUNS["table-10"], spark_bridge.FULL) == default
    small = spark_bridge.max_offsets(spark_bridge.RUNS["table-10-small"], spark_bridge.FULL)
    assert small == default // 4
    # Four steady micro-batches after the first.
    assert spark_bridge.FULL["events"] // default == 5
