"""Smoke test for bench/filter_throughput.py and checks on its workload builder.

The script runs at its ``--quick`` size in a subprocess, so it cannot rot;
the workload builder (``bench/workload.py``) is checked for determinism and
for the shapes it promises.
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

from bench import filter_throughput, workload  # noqa: E402
from routing import MQTT, NATIVE, Filter, SubscriptionTable, parse_filter  # noqa: E402
from routing.filters import STAR, Prefix  # noqa: E402
from tests.benchrun import run_quick  # noqa: E402

SCRIPT = ROOT / "bench" / "filter_throughput.py"

RESULT_KEYS = {
    "size",
    "n_sites",
    "world",
    "build_seconds",
    "bytes_per_subscription",
    "cold_matches_per_second",
    "cold_mean_answer",
    "warm_matches_per_second",
    "warm_hit_rate",
    "naive_matches_per_second",
    "trie_over_naive",
    "agree",
    "agree_checked",
    "agree_nonempty_answers",
    "subscribe_per_second",
    "unsubscribe_per_second",
}
POSITIVE = [
    "build_seconds",
    "bytes_per_subscription",
    "cold_matches_per_second",
    "cold_mean_answer",
    "warm_matches_per_second",
    "warm_hit_rate",
    "naive_matches_per_second",
    "trie_over_naive",
    "subscribe_per_second",
    "unsubscribe_per_second",
]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "filter_throughput.json")


def test_quick_run_writes_well_formed_json(quick_run: tuple) -> None:
    _, report = quick_run
    assert {"benchmark", "machine", "parameters", "results", "goals", "agree"} <= report.keys()
    assert {"python", "platform", "cpu_count"} <= report["machine"].keys()
    assert report["parameters"]["seed"] == 0
    assert report["parameters"]["quick"] is True
    assert isinstance(report["parameters"]["counts"], dict)
    (result,) = report["results"]
    assert result.keys() >= RESULT_KEYS
    assert result["size"] == 1000
    assert result["n_sites"] == workload.N_SITES == workload.scaled_sites(1000)
    assert result["world"] == "scaled"
    assert result["fixed_world_comparison"] is False
    assert report["parameters"]["world"] == "scaled"
    assert report["fixed_world_comparison"] is None
    for key in POSITIVE:
        assert isinstance(result[key], int | float) and result[key] > 0, (key, result[key])
    assert 0 < result["warm_hit_rate"] <= 1
    assert {g["status"] for g in report["goals"]} <= {"PASS", "FAIL", "not measured"}


def test_quick_run_trie_agrees_with_naive_scan(quick_run: tuple) -> None:
    _, report = quick_run
    (result,) = report["results"]
    assert report["agree"] is True
    assert result["agree"] is True
    assert result["agree_disagreements"] == 0
    assert result["agree_checked"] > 0
    assert result["agree_nonempty_answers"] > 0
    # Answers that reach tenants, not only the broad filters.
    assert result["agree_tenant_answers"] > 0


def test_quick_run_prints_a_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:1] == ["S"])
    columns = ("sites", "build", "bytes/sub", "cold", "warm", "naive", "agree", "sub/s", "unsub/s")
    for column in columns:
        assert column in lines[header]
    assert set(lines[header + 1]) <= {"-", " "}
    rows = []
    for line in lines[header + 2 :]:
        if not line.strip():
            break
        rows.append(line.split())
    assert len(rows) == 1
    assert rows[0][0] == "1000"
    assert rows[0][1] == str(workload.N_SITES)
    assert "yes" in rows[0]
    assert any(line.startswith("check") for line in lines)


# -- workload -----------------------------------------------------------------


def test_workload_is_deterministic() -> None:
    assert workload.subscriptions(2000, seed=7) == workload.subscriptions(2000, seed=7)
    assert workload.subscriptions(2000, seed=7) != workload.subscriptions(2000, seed=8)
    assert workload.topics(500, seed=3) == workload.topics(500, seed=3)
    assert workload.topics(500, seed=3) != workload.topics(500, seed=4)
    assert workload.warm_topics(500, seed=3, hot=50) == workload.warm_topics(500, seed=3, hot=50)


def test_subscriptions_have_the_promised_shapes() -> None:
    size = 4000
    entries = workload.subscriptions(size, seed=1)
    assert len(entries) == size
    assert len(set(entries)) == size  # distinct (filter, subscriber, dialect)
    for broad in workload.BROAD_FILTERS:
        assert broad in entries
    dialects = Counter(dialect for _, _, dialect in entries)
    assert dialects.keys() == {NATIVE, MQTT}
    assert 0.08 < dialects[MQTT] / size < 0.25

    parsed = [parse_filter(text, dialect) for text, _, dialect in entries]  # all parse
    assert any(any(isinstance(t, Prefix) for t in f.levels) for f in parsed)
    assert any(STAR in f.levels for f in parsed)
    assert any(f.is_literal for f in parsed)
    shares = Counter(_shape(f) for f in parsed)
    assert 0.35 < shares["site"] / size < 0.45  # beacon/{r}/{c}/{site}/>
    assert 0.15 < shares["entity"] / size < 0.30  # literal (native or mqtt)
    assert 0.07 < shares["prefix"] / size < 0.13

    per_subscriber = Counter(subscriber for _, subscriber, _ in entries)
    tenants = [n for s, n in per_subscriber.items() if s.startswith("svc-0")]
    assert max(tenants) <= 7
    assert size / 6 < len(per_subscriber) < size / 3
    # A tenant watches its own site (a second one only when a shape repeats).
    sites: dict[str, set[str]] = {}
    for text, subscriber, _ in entries:
        if subscriber.startswith("svc-0"):
            sites.setdefault(subscriber, set()).add(text.split("/")[3])
    assert sum(len(s) == 1 for s in sites.values()) > 0.4 * len(sites)


def _shape(flt: Filter) -> str:
    if any(isinstance(t, Prefix) for t in flt.levels):
        return "prefix"
    if flt.is_literal:
        return "entity"
    if flt.dialect == NATIVE and flt.rest is not None and len(flt.levels) == 4:
        return "site" if all(isinstance(t, str) for t in flt.levels) else "other"
    return "other"


def test_fresh_subscriptions_do_not_collide() -> None:
    entries = workload.subscriptions(500, seed=0)
    fresh = workload.subscriptions(300, seed=1, prefix="churn", broad=False)
    assert len(fresh) == 300
    assert not {s for _, s, _ in fresh} & {s for _, s, _ in entries}
    table = SubscriptionTable()
    for text, subscriber, dialect in entries:
        assert table.add(text, subscriber, dialect)
    for text, subscriber, dialect in fresh:
        assert table.add(text, subscriber, dialect)
    assert len(table) == 800


def test_topics_are_valid_and_reach_subscribers() -> None:
    entries = workload.subscriptions(1000, seed=0)
    table = SubscriptionTable(cache_size=0)
    for text, subscriber, dialect in entries:
        table.add(text, subscriber, dialect)
    cold = workload.topics(2000, seed=0)
    assert len(set(cold)) > 1000  # mostly cold
    assert all(len(t.split("/")) == 6 and t.startswith("beacon/") for t in cold)
    assert all(table.match(t) for t in cold)  # beacon/# is always there
    warm = workload.warm_topics(5000, seed=0, hot=100)
    assert len(set(warm)) <= 100
    probes = workload.topics_on_sites(entries, 200, seed=0)
    broad = {s for _, s, _ in workload.BROAD_FILTERS}
    assert sum(not table.match(t) <= broad for t in probes) > 50


def test_default_world_is_the_fixed_one() -> None:
    assert workload.world() is workload.world(workload.N_SITES)
    sites, popularity, cum = workload.world()
    assert len(sites) == len(popularity) == len(cum) == workload.N_SITES
    assert workload.subscriptions(500, seed=2, n_sites=workload.N_SITES) == (
        workload.subscriptions(500, seed=2)
    )
    assert workload.topics(300, seed=2, n_sites=workload.N_SITES) == workload.topics(300, seed=2)


def test_scaled_sites() -> None:
    assert workload.scaled_sites(1) == workload.N_SITES
    assert workload.scaled_sites(1_000) == workload.N_SITES
    assert workload.scaled_sites(100_000) == workload.N_SITES
    assert workload.scaled_sites(1_000_000) == 200_000


def test_growing_the_world_appends_sites() -> None:
    base_sites, _, _ = workload.world(workload.N_SITES)
    n = workload.N_SITES + 5_000
    sites, popularity, cum = workload.world(n)
    assert len(sites) == len(popularity) == len(cum) == n
    assert sites[: workload.N_SITES] == base_sites  # the first 20,000 sites do not move
    assert sorted(popularity) == list(range(n))
    assert len({site_id for site_id, _, _ in sites}) == n
    assert {region for _, region, _ in sites[workload.N_SITES :]} == set(workload.REGIONS)
    assert all(country in workload.REGIONS[region] for _, region, country in sites)
    # And a smaller world is a prefix too.
    assert workload.world(50)[0] == base_sites[:50]
    assert workload.site_path(123, n_sites=n) == workload.site_path(123)
    with pytest.raises(ValueError):
        workload.world(0)


def test_a_larger_world_spreads_subscriptions_and_topics_over_it() -> None:
    n = workload.N_SITES + 5_000
    site_ids = {site_id for site_id, _, _ in workload.world(n)[0]}
    new_ids = {site_id for site_id, _, _ in workload.world(n)[0][workload.N_SITES :]}

    entries = workload.subscriptions(2_000, seed=0, n_sites=n)
    assert len(entries) == len(set(entries)) == 2_000
    named = {t.split("/")[3] for t, s, _ in entries if s.startswith("svc-0")}
    assert named <= site_ids  # only sites of that world
    assert named & new_ids  # ... including appended ones
    assert all(parse_filter(text, dialect) for text, _, dialect in entries)

    cold = workload.topics(2_000, seed=0, n_sites=n)
    assert {t.split("/")[3] for t in cold} <= site_ids
    assert {t.split("/")[3] for t in cold} & new_ids
    warm = workload.warm_topics(500, seed=0, hot=50, n_sites=n)
    assert len(set(warm)) <= 50 and {t.split("/")[3] for t in warm} <= site_ids

    table = SubscriptionTable(cache_size=0)
    for text, subscriber, dialect in entries:
        table.add(text, subscriber, dialect)
    probes = workload.topics_on_sites(entries, 200, seed=0, n_sites=n)
    assert len(probes) == 200
    broad = {s for _, s, _ in workload.BROAD_FILTERS}
    assert sum(not table.match(t) <= broad for t in probes) > 50


# -- benchmark plumbing (no timing runs) ----------------------------------------


def test_plan_adds_a_fixed_world_row_for_1m_in_a_scaled_run() -> None:
    plan = filter_throughput.plan_rows([1_000, 1_000_000], "scaled")
    assert [(r["size"], r["n_sites"], r.get("comparison", False)) for r in plan] == [
        (1_000, 20_000, False),
        (1_000_000, 200_000, False),
        (1_000_000, 20_000, True),
    ]
    fixed = filter_throughput.plan_rows([1_000, 1_000_000], "fixed")
    assert [(r["size"], r["n_sites"], r.get("comparison", False)) for r in fixed] == [
        (1_000, 20_000, False),
        (1_000_000, 20_000, False),
    ]
    assert len(filter_throughput.plan_rows([1_000, 100_000], "scaled")) == 2


def test_comparison_row_is_labelled_and_left_out_of_the_goals() -> None:
    def row(size: int, n_sites: int, cold: float, comparison: bool = False) -> dict:
        return {
            "size": size,
            "n_sites": n_sites,
            "cold_matches_per_second": cold,
            "cold_mean_answer": 2.0 if not comparison else 20.0,
            "fixed_world_comparison": comparison,
        }

    results = [
        row(1_000, 20_000, 100.0),
        row(1_000_000, 200_000, 80.0),
        row(1_000_000, 20_000, 30.0, comparison=True),
    ]
    lines = filter_throughput.format_table(results).splitlines()
    assert [line.split()[0] for line in lines[2:5]] == ["1000", "1000000", "1000000*"]
    assert [line.split()[1] for line in lines[2:5]] == ["20000", "200000", "20000"]
    assert lines[-1] == filter_throughput.FOOTNOTE and lines[-1].startswith("* fixed 20,000")

    goals = filter_throughput.check_goals(results, "scaled")
    (cold_goal,) = [g for g in goals if g["goal"].startswith("cold at S=1M")]
    assert cold_goal["measured"] == pytest.approx(0.8)
    assert cold_goal["status"] == "PASS"
    assert "scaled world, 200,000 sites" in cold_goal["goal"]
    comparison = filter_throughput.fixed_world_ratio(results)
    assert comparison is not None
    assert comparison["ratio"] == pytest.approx(0.3)
    assert comparison["mean_answer"] == 20.0
    assert filter_throughput.fixed_world_ratio(results[:2]) is None


def test_comparison_run_measures_build_cold_and_warm_only() -> None:
    counts = dict(filter_throughput.QUICK, cold_max=500, warm_max=2_000)
    counts.update(cold_seconds=0.2, warm_seconds=0.2)
    result = filter_throughput.run_size(
        1_000, 0, counts, n_sites=workload.N_SITES + 5_000, comparison=True
    )
    assert result["n_sites"] == workload.N_SITES + 5_000
    assert result["fixed_world_comparison"] is True
    for key in ("build_seconds", "cold_matches_per_second", "warm_matches_per_second"):
        assert result[key] > 0, key
    # In this (warmed-up) process the heap may hold the table without growing.
    assert result["bytes_per_subscription"] >= 0
    assert result["agree"] is None and result["naive_matches_per_second"] is None
    assert result["subscribe_per_second"] is None and "churn_ops" not in result
    assert "bytes_per_subscription_adds_only" not in result
