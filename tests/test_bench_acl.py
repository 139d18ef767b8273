"""bench/acl.py: its quick run in a subprocess (so the benchmark cannot rot), and the rule set
and exactness reference it judges the brokers by, property-tested against crossload's dense
Expectation and a brute-force matcher (tests/reference.py). Only the report's shape and
exactness facts are checked, never timings."""

from __future__ import annotations

import subprocess
import tomllib
from array import array

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import acl
from bench.harness.crossload import Expectation
from routing import MQTT, NATIVE, covers, parse_filter
from tests.benchrun import ROOT, run_quick, still_running
from tests.reference import ref_matches

SCRIPT = ROOT / "bench" / "acl.py"
OURS = (b"broker.cli", b"multiprocessing")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess, dict]:
    return run_quick(SCRIPT, tmp_path_factory.mktemp("bench") / "acl.json")


def test_the_rule_file_holds_every_rule_as_written() -> None:
    rules = acl.rule_set(1_000, seed=0)
    assert len(rules) == 1_000 and rules[: len(acl.COMMON_RULES)] == list(acl.COMMON_RULES)
    parsed = tomllib.loads(acl.acl_toml(rules))["rule"]
    assert [{"dialect": NATIVE, **r} for r in parsed] == [{"dialect": NATIVE, **r} for r in rules]
    whos = {r["who"].split(":")[0] for r in rules}
    assert whos == {"*", "user", "group", "cert"}
    assert {r.get("dialect", NATIVE) for r in rules} == {NATIVE, MQTT}


def test_only_the_rules_for_everyone_bind_the_anonymous_clients() -> None:
    rules = acl.rule_set(1_000, seed=0)
    everyone = [r for r in rules if r["who"] == "*"]
    assert everyone == list(acl.COMMON_RULES)


def test_client_deny_gives_each_client_a_deny_rule_of_its_own() -> None:
    rules = acl.rule_set(1_000, seed=0, client_deny=True)
    assert len(rules) == 1_000 and acl.CLIENT_DENY in rules
    shared = acl.binding_denies(acl.rule_set(1_000, seed=0), "c1")
    assert acl.binding_denies(rules, "c1") == [*shared, ("client/c1/private/>", NATIVE)]


def test_every_filter_a_client_subscribes_is_granted_by_a_rule_for_everyone() -> None:
    work = acl.plan({**acl.QUICK, "connections": 1_000, "messages": 10}, seed=0)
    allowed = [
        parse_filter(r["filter"].replace("%c", "s0-1-2"), r.get("dialect", NATIVE))
        for r in acl.COMMON_RULES
        if "subscribe" in r.get("allow", ()) and "%u" not in r["filter"]
    ]
    wanted = [f for conn in work["ordered"] for f in conn]
    wanted += [acl.OWN_FILTER.format(client="s0-1-2"), "bench/control/done"]
    assert len(wanted) == 4_002
    for text in wanted:
        assert any(covers(rule, parse_filter(text)) for rule in allowed), text


def test_binding_denies_put_in_the_client_id_and_leave_out_user_rules() -> None:
    rules = [
        {"who": "*", "deny": ["subscribe"], "filter": "a/%c/>"},
        {"who": "*", "deny": ["subscribe"], "filter": "u/%u/#", "dialect": MQTT},
        {"who": "*", "deny": ["publish"], "filter": "p/>"},
        {"who": "user:x", "deny": ["subscribe"], "filter": "x/>"},
        {"who": "*", "allow": ["subscribe"], "filter": "b/>"},
        {"who": "*", "deny": ["subscribe", "publish"], "filter": "d/+", "dialect": MQTT},
    ]
    assert acl.binding_denies(rules, "c7") == [("a/c7/>", NATIVE), ("d/+", MQTT)]


def test_owed_leaves_out_what_a_deny_matches_and_counts_it_withheld() -> None:
    connections = [["a/>"], ["a/x", "b/*"], ["c/x"]]
    topics = ["a/x", "b/y", "a/z", "a/x", "c/x"]
    owed = acl.Owed.build(connections, topics, [[("a/x", NATIVE)], [], [("c/#", MQTT)]])
    assert [list(p) for p in owed.positions] == [[2], [0, 1, 3], []]
    assert owed.withheld == 3  # a/x twice for connection 0, c/x once for connection 2
    plain = acl.Owed.build(connections, topics)
    assert [list(p) for p in plain.positions] == [[0, 2, 3], [0, 1, 3], [4]]
    assert plain.withheld == 0


def test_owed_checks_message_by_message() -> None:
    owed = acl.Owed([array("q", [0, 2, 3, 5])], withheld=0)
    got = owed.check(0, array("q", [0, 2, 2, 4, 9]), sent=4)  # 3 missing, 2 twice, 4 and 9
    assert got == {"expected": 3, "received": 5, "missing": 1, "duplicates": 1, "unexpected": 2}


LEVELS = st.sampled_from(["a", "b"])
TOPICS = st.lists(LEVELS, min_size=1, max_size=3).map("/".join)
FILTERS = st.lists(st.sampled_from(["a", "b", "*"]), min_size=1, max_size=3).map(
    lambda levels: "/".join(levels)
) | TOPICS.map(lambda t: t + "/>")


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(FILTERS, max_size=3), min_size=1, max_size=4),
    st.lists(TOPICS, min_size=1, max_size=12),
    st.lists(st.integers(0, 14), max_size=20),
    st.data(),
)
def test_owed_without_denies_agrees_with_the_dense_expectation(
    connections: list[list[str]], topics: list[str], received: list[int], data: st.DataObject
) -> None:
    dense = Expectation.build(connections, topics, ["connection"])["connection"]
    owed = acl.Owed.build(connections, topics)
    for conn, row in enumerate(dense.per_position):
        assert list(owed.positions[conn]) == [i for i, copies in enumerate(row) if copies]
    conn = data.draw(st.integers(0, len(connections) - 1))
    sent = data.draw(st.integers(0, len(topics)))
    assert owed.check(conn, received, sent) == dense.check(conn, received, sent)


DENIES = st.tuples(FILTERS, st.just(NATIVE)) | st.tuples(
    st.lists(st.sampled_from(["a", "b", "+"]), min_size=1, max_size=3).map("/".join), st.just(MQTT)
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.lists(FILTERS, max_size=3), st.lists(DENIES, max_size=2)), max_size=4),
    st.lists(TOPICS, min_size=1, max_size=12),
)
def test_owed_is_what_a_filter_matches_and_no_deny_does(
    connections: list[tuple[list[str], list[tuple[str, str]]]], topics: list[str]
) -> None:
    owed = acl.Owed.build([c for c, _ in connections], topics, [d for _, d in connections])
    withheld = 0
    for conn, (filters, denies) in enumerate(connections):
        wanted = [any(ref_matches(f, NATIVE, t) for f in filters) for t in topics]
        denied = [any(ref_matches(f, d, t) for f, d in denies) for t in topics]
        assert list(owed.positions[conn]) == [
            i for i in range(len(topics)) if wanted[i] and not denied[i]
        ]
        withheld += sum(w and d for w, d in zip(wanted, denied, strict=True))
    assert owed.withheld == withheld


def test_quick_run_measures_both_brokers_exactly(quick_run: tuple) -> None:
    _, report = quick_run
    assert report["benchmark"] == "acl"
    params = report["parameters"]
    assert params["quick"] is True and params["rules"] == 1_000 and params["rounds"] == 1
    runs = {r["kind"]: r for r in report["runs"]}
    assert list(runs) == ["plain", "acl"]  # round 1: plain first
    for kind, r in runs.items():
        assert "error" not in r, r["error"]
        connections = params["connections"]
        assert r["subscribed"] == connections * (acl.FILTERS_PER_CONNECTION + 2)
        tput = r["throughput"]
        assert tput["complete"] is True and tput["messages"] == params["messages"]
        exact = tput["exactness"]
        assert exact["exact"] is True, exact
        assert exact["received"] == exact["expected"] > 0 and exact["connections"] == connections
        assert r["broker_stop"] == {**r["broker_stop"], "exit_status": 0, "killed": False}
        assert r["broker_log_summary"]["problem_count"] == 0, r["broker_log_summary"]
        assert tput["broker_counters"].get("dropped", 0) == 0
        for pid in [r["broker_pid"], *r["worker_pids"]]:
            assert not still_running(pid, *OURS), (kind, pid)
    assert runs["plain"]["rules"] == 0 and runs["plain"]["throughput"]["withheld"] == 0
    withheld = runs["acl"]["throughput"]["withheld"]
    assert withheld > 0  # the deny rules hit part of the traffic
    assert runs["acl"]["throughput"]["broker_denied"] == withheld  # the broker's own count
    assert runs["plain"]["throughput"]["broker_denied"] == 0
    assert report["notes"] == []
    received = {k: r["throughput"]["exactness"]["received"] for k, r in runs.items()}
    assert received["acl"] + withheld == received["plain"]  # the same clients, less the denied
    (ratio,) = report["rounds"]
    assert ratio["completion"] > 0 and report["summary"]["median_ratio"] == ratio["completion"]
    goals = report["goals"]
    assert goals[0]["status"] == "not measured" and goals[1]["status"] == "PASS"


def test_quick_run_prints_one_table(quick_run: tuple) -> None:
    proc, _ = quick_run
    lines = proc.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["round", "broker"])
    for column in ("msg/s", "acl/plain", "CPU s", "withheld", "exact", "RSS MB"):
        assert column in lines[header]
    rows = [line.split() for line in lines[header + 2 : header + 4]]
    assert [row[:3] for row in rows] == [["1", "plain", "0"], ["1", "acl", "1000"]]
    assert rows[1][9].endswith("x")  # the ratio, on the acl row
    assert any(line.startswith("acl / plain msg/s by round:") for line in lines)
