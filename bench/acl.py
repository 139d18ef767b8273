"""The cost of topic ACLs: fan-out to 1,000 connections, with 1,000 rules and without.

    python bench/acl.py [--quick] [--json PATH] [--rounds N] [--messages N]
                        [--connections N] [--rules N] [--seed N] [--log-dir DIR]
                        [--client-deny] [--profile DIR]

Issue 19 asks: "fan-out with 1,000 ACL rules and 1,000 clients vs no ACLs: >= 0.9x the
throughput", measured side by side in one run. Each round starts two topiary brokers
fresh, one after the other, with the same clients and the same workload:

- ``plain``: no ACLs;
- ``acl``: ``[acl] file = ...`` holding the rule set below.

Both get the ``[limits]`` of bench/harness/peers.py (subscribers are queued for, never
dropped), and the rounds alternate the order (plain first in odd rounds, acl first in
even ones): the machine is shared and noisy, so one pair says little and the ratio is
judged on the median of the rounds' ratios.

The rule set (``rule_set``), 1,000 rules. The clients are anonymous (a users file would
cost 1,000 scrypt logins at start and tell nothing about the per-message cost), so the
rules that bind them are those for everyone (``who = "*"``, ``COMMON_RULES``):

- allow subscribe and publish on ``beacon/>`` (every workload filter is covered by it,
  every workload topic matched), on ``bench/control/#`` (MQTT dialect: the end marker)
  and on ``client/%c/>``: every client has rules of its own, compiled with its client id,
  and uses one: each connection subscribes to ``client/ITS-ID/>``, which only that rule
  grants (a refusal fails the run);
- allow on ``user/%u/#`` (the issue's example): it binds users only, an anonymous client
  has no name to put in;
- deny subscribe on ``beacon/*/*/*/admin/>`` (the issue's example; no workload topic has
  an ``admin`` section, so it is checked on every delivery and never hits), on
  ``beacon/+/+/+/+/signup`` (MQTT dialect), ``beacon/*/*/*/help/error`` and
  ``beacon/me/qa/>`` (they withhold ~1% of the copies: deny per message is the
  expensive path, exercised on every delivery, and a few hits show it works without
  making the ACL broker's job much lighter; the table shows how many were withheld);
- deny publish on ``beacon/*/*/*/admin/>``: every publish checks a deny rule too, none
  hits.

Every client has the same deny-subscribe rules, as deny rules for everyone make them: a
broker may ask them once per message for all its clients. ``--client-deny`` adds a tenth,
``CLIENT_DENY``: deny subscribe on ``client/%c/private/>`` (no topic published matches
it), which gives every client a deny set of its own, the case where a broker must ask
each client's rules for each delivery.

The rest (991 of 1,000, or 990 with ``--client-deny``; ``other_rules``) name principals
that never connect: users (``user:tenant-NNNNN``: allow subscribe on a site, in either
dialect; deny subscribe on a site's account pages; deny publish of a site's purchases),
groups (``group:team-NN``: allow on a region, or on ``user/%u/#``) and certificates
(``cert:CN=device-NNNNN,O=topiary``: allow publish on ``device/%c/>``). The broker must
parse and index them, and pass over them for every client; their filters are about the
same workload sites.

``--profile DIR`` runs the brokers under cProfile (DIR/roundN-KIND.prof): slower, for
finding where the time goes, not for the figures.

Workload (bench/workload.py, through bench/harness/crossload.py as bench/sidebyside.py
uses it): N = 1,000 subscriber connections in 2 processes, holding between them the first
4N portable filters of ``workload.subscriptions(.., seed)`` round-robin (connection k
holds filters k::N, so the platform-wide ones such as ``beacon/#`` land on different
connections), plus their ``client/ID/>`` and the control topic; one publisher connection
writes ``workload.topics(200,000, seed)`` in order, payloads of 200-800 bytes, as fast as
it can (256 per write), then a PING round trip and a marker on the control topic until
every subscriber has one. Completion = first publish -> the last delivery to any
subscriber; msg/s = messages / completion.

Exactness, per connection, message by message (``Owed``): the copies it got against those
it is owed, which are the published topics that one of its filters matches
(``routing.SubscriptionTable``) and, on the acl broker, no deny-subscribe rule binding
it matches (the rules for everyone, ``%c`` put in). ``crossload.Expectation`` keeps a
dense row per connection (N x 200,000 entries); ``Owed`` keeps each connection's owed
positions instead. The broker's own count of the copies it withheld
(``acl_denied_deliveries``) must equal the reference's (a note says when not). Per broker
also its CPU seconds over the throughput phase and its peak RSS (/proc): on a shared
machine the rates swing from one broker to the next, the CPU seconds for the same work
much less, so the median CPU ratio (acl / plain) is printed beside the rates'.

Goal (issue 19; for information, it does not set the exit status): the median over the
rounds of acl msg/s / plain msg/s >= 0.9, judged only on a full run (200,000 messages,
1,000 connections, 1,000 rules, every delivery exact).

``--quick``: 40 connections, 4,000 messages, one round (a smoke test; still 1,000
rules). Every wait is bounded: a broker that fails or a worker that hangs gives an error
row, not a hang; a phase whose marker has not reached every subscriber within 60 s + 1 s
per 10,000 messages is cut short and marked. The exit status is 0 unless a run failed.
On 2 cores the Python clients compete with the broker for CPU, the same for both brokers.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from bench import workload  # noqa: E402
from bench.harness import BenchError  # noqa: E402
from bench.harness.crossload import (  # noqa: E402
    brief,
    portable_subscriptions,
    publisher_main,
    publisher_topics,
    split,
    subscriber_main,
)
from bench.harness.logs import broker_notes, scan_log  # noqa: E402
from bench.harness.peers import TOPIARY_CONFIG  # noqa: E402
from bench.harness.processes import (  # noqa: E402
    BrokerProcess,
    broker_stats,
    start_broker,
    stop_broker,
)
from bench.harness.procfs import cpu_seconds, proc_status  # noqa: E402
from bench.harness.report import (  # noqa: E402
    Goals,
    arg_parser,
    fmt,
    machine_info,
    print_ending,
    write_report,
)
from bench.harness.workers import Worker  # noqa: E402
from routing import MQTT, NATIVE, SubscriptionTable  # noqa: E402

KINDS: Final = ("plain", "acl")
PAYLOAD_SIZES: Final = (200, 800)
FILTERS_PER_CONNECTION: Final = 4
OWN_FILTER: Final = "client/{client}/>"  # each connection's own, granted by client/%c/>
WORKER_READY_TIMEOUT: Final = 120.0
GOAL_RATIO: Final = 0.9
DENIED_COUNTER: Final = "acl_denied_deliveries"  # the broker's count of copies withheld
GOAL_MESSAGES: Final = 200_000
GOAL_CONNECTIONS: Final = 1_000
GOAL_RULES: Final = 1_000

FULL: Final[dict[str, Any]] = {
    "messages": GOAL_MESSAGES,
    "connections": GOAL_CONNECTIONS,
    "processes": 2,
    "rules": GOAL_RULES,
    "rounds": 3,
    "drain_timeout": 60.0,
}
QUICK: Final[dict[str, Any]] = {
    **FULL,
    "messages": 4_000,
    "connections": 40,
    "rounds": 1,
    "drain_timeout": 20.0,
}

BOTH: Final = ["subscribe", "publish"]
#: The rules that bind every client, anonymous ones included (see the module docstring).
COMMON_RULES: Final[tuple[dict[str, Any], ...]] = (
    {"who": "*", "allow": BOTH, "filter": "beacon/>"},
    {"who": "*", "allow": BOTH, "filter": "bench/control/#", "dialect": MQTT},
    {"who": "*", "allow": BOTH, "filter": "client/%c/>"},
    {"who": "*", "allow": BOTH, "filter": "user/%u/#", "dialect": MQTT},
    {"who": "*", "deny": ["subscribe"], "filter": "beacon/*/*/*/admin/>"},
    {"who": "*", "deny": ["subscribe"], "filter": "beacon/+/+/+/+/signup", "dialect": MQTT},
    {"who": "*", "deny": ["subscribe"], "filter": "beacon/*/*/*/help/error"},
    {"who": "*", "deny": ["subscribe"], "filter": "beacon/me/qa/>"},
    {"who": "*", "deny": ["publish"], "filter": "beacon/*/*/*/admin/>"},
)
#: With ``--client-deny``: a deny rule for everyone with ``%c`` in it, so that no two
#: clients share their deny-subscribe rules (no topic published matches it).
CLIENT_DENY: Final[dict[str, Any]] = {
    "who": "*",
    "deny": ["subscribe"],
    "filter": "client/%c/private/>",
}


# -- the rule set ------------------------------------------------------------------------------


def other_rules(count: int, seed: int) -> list[dict[str, Any]]:
    """``count`` rules for users, groups and certificates that never connect, about the
    workload's sites, in both dialects, some with ``%u``/``%c``; deterministic."""
    rng = random.Random(f"acl-rules:{seed}")
    sites = workload.world()[0]
    regions = list(workload.REGIONS)
    out: list[dict[str, Any]] = []
    for i in range(count):
        site, region, country = sites[rng.randrange(len(sites))]
        user = f"user:tenant-{i:05d}"
        kind = i % 7
        if kind == 0:
            rule = {
                "who": user,
                "allow": ["subscribe"],
                "filter": f"beacon/{region}/{country}/{site}/>",
            }
        elif kind == 1:
            rule = {"who": user, "allow": BOTH, "filter": f"beacon/+/+/{site}/#", "dialect": MQTT}
        elif kind == 2:
            rule = {"who": user, "deny": ["subscribe"], "filter": f"beacon/*/*/{site}/account/>"}
        elif kind == 3:
            section = rng.choice(workload.SECTIONS)
            rule = {
                "who": user,
                "deny": ["publish"],
                "filter": f"beacon/{region}/{country}/{site}/{section}/purchase",
            }
        elif kind == 4:
            rule = {
                "who": f"group:team-{i % 50:02d}",
                "allow": ["subscribe"],
                "filter": f"beacon/{rng.choice(regions)}/#",
                "dialect": MQTT,
            }
        elif kind == 5:
            group = f"group:team-{i % 50:02d}"
            rule = {"who": group, "allow": BOTH, "filter": "user/%u/#", "dialect": MQTT}
        else:
            rule = {
                "who": f"cert:CN=device-{i:05d},O=topiary",
                "allow": ["publish"],
                "filter": "device/%c/>",
            }
        out.append(rule)
    return out


def binding_rules(client_deny: bool = False) -> list[dict[str, Any]]:
    """The rules for everyone: ``COMMON_RULES``, and ``CLIENT_DENY`` with ``client_deny``."""
    return [*COMMON_RULES, CLIENT_DENY] if client_deny else list(COMMON_RULES)


def rule_set(total: int, seed: int, client_deny: bool = False) -> list[dict[str, Any]]:
    """``binding_rules(client_deny)``, then ``other_rules`` up to ``total`` rules."""
    common = binding_rules(client_deny)
    if total < len(common):
        raise ValueError(f"at least {len(common)} rules (those that bind the clients)")
    return [*common, *other_rules(total - len(common), seed)]


def acl_toml(rules: Sequence[dict[str, Any]]) -> str:
    """The rules as an ACL file (``dialect`` written only when not native, the default)."""
    lines: list[str] = []
    for rule in rules:
        lines.append("[[rule]]")
        for key in ("who", "allow", "deny", "filter", "dialect"):
            if key in rule and not (key == "dialect" and rule[key] == NATIVE):
                lines.append(f"{key} = {json.dumps(rule[key])}")  # TOML's strings and arrays
        lines.append("")
    return "\n".join(lines)


def binding_denies(rules: Sequence[dict[str, Any]], client_id: str) -> list[tuple[str, str]]:
    """The deny-subscribe filters (text, dialect) that bind an anonymous client: rules for
    everyone, ``%c`` replaced by its id; one with ``%u`` binds users only."""
    out = []
    for rule in rules:
        if rule["who"] != "*" or "subscribe" not in rule.get("deny", ()):
            continue
        if "%u" in rule["filter"]:
            continue
        out.append((rule["filter"].replace("%c", client_id), rule.get("dialect", NATIVE)))
    return out


# -- exactness ---------------------------------------------------------------------------------


class Owed:
    """Which messages each connection is owed: its positions in the publisher's list.

    Sparse, unlike ``crossload.Expectation``: 1,000 connections x 200,000 messages would be
    200 million entries there, and most connections are owed a few hundred.
    """

    def __init__(self, positions: list[array], withheld: int) -> None:
        self.positions = positions
        #: Copies a connection's filters match that a deny rule withholds.
        self.withheld = withheld

    @classmethod
    def build(
        cls,
        connections: Sequence[Sequence[str]],
        topics: Sequence[str],
        denies: Sequence[Sequence[tuple[str, str]]] | None = None,
    ) -> Owed:
        """``connections``' filters (native form), the ``topics`` published in order, and
        per connection the deny filters (text, dialect) that bind it (None: no ACLs)."""
        table = SubscriptionTable(cache_size=0)
        for conn, filters in enumerate(connections):
            for text in filters:
                table.add(text, conn)
        deny = SubscriptionTable(cache_size=0)
        for conn, filters in enumerate(denies or ()):
            for text, dialect in filters:
                deny.add(text, conn, dialect)
        owed_by_topic: dict[str, tuple[int, ...]] = {}
        withheld_by_topic: dict[str, int] = {}
        for topic in set(topics):
            matched = table.match_uncached(topic)
            denied = deny.match_uncached(topic) if matched and len(deny) else frozenset()
            owed_by_topic[topic] = tuple(sorted(matched - denied))
            withheld_by_topic[topic] = len(matched & denied)
        positions = [array("q") for _ in connections]
        withheld = 0
        for index, topic in enumerate(topics):
            for conn in owed_by_topic[topic]:
                positions[conn].append(index)
            withheld += withheld_by_topic[topic]
        return cls(positions, withheld)

    def check(self, conn: int, indices: Sequence[int], sent: int) -> dict[str, int]:
        """Message by message: the copies ``conn`` received (``indices``, one per copy)
        against one copy of each owed message among the first ``sent``."""
        got = Counter(indices)
        missing = duplicates = 0
        expected = 0
        for index in self.positions[conn]:
            if index >= sent:
                break
            expected += 1
            have = got.pop(index, 0)
            if have == 0:
                missing += 1
            elif have > 1:
                duplicates += have - 1
        return {
            "expected": expected,
            "received": len(indices),
            "missing": missing,
            "duplicates": duplicates,
            "unexpected": sum(got.values()),
        }


def exactness(rows: list[dict[str, Any]], owed: Owed, sent: int) -> dict[str, Any]:
    """Every connection's check and their totals; exact when nothing is off and no
    connection had an error."""
    conns = []
    for k, row in enumerate(rows):
        indices = array("q")
        indices.frombytes(row["indices"])
        check = owed.check(k, indices, sent)
        check["error"] = row["error"]
        conns.append(check)
    totals = {
        key: sum(c[key] for c in conns)
        for key in ("expected", "received", "missing", "duplicates", "unexpected")
    }
    exact = all(c["error"] is None for c in conns) and (
        totals["missing"] == totals["duplicates"] == totals["unexpected"] == 0
    )
    errors = [c["error"] for c in conns if c["error"]]
    off = [k for k, c in enumerate(conns) if c["missing"] or c["duplicates"] or c["unexpected"]]
    return {
        "exact": exact,
        **totals,
        "connections": len(conns),
        "connections_off": off[:20],
        "errors": errors[:5],
    }


# -- one broker --------------------------------------------------------------------------------


def plan(params: dict[str, Any], seed: int) -> dict[str, Any]:
    """The workload both brokers get: filters per connection, connections per process,
    the publisher's topics."""
    n = params["connections"]
    filters, drawn = portable_subscriptions(FILTERS_PER_CONNECTION * n, seed)
    conns = split(filters, n)
    processes = split(conns, params["processes"])
    return {
        "processes": processes,
        "ordered": [conn for process in processes for conn in process],  # the rows' order
        "topics": publisher_topics(params["messages"], seed),
        "filters": {**drawn, "kept": len(filters)},
    }


def _stats(port: int) -> dict[str, Any]:
    try:
        return broker_stats(port)
    except Exception as exc:  # a broker that no longer answers: recorded, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def counter_moves(before: dict[str, Any], after: dict[str, Any]) -> dict[str, int]:
    """How the broker's numeric counters moved (those that did), over a phase."""
    if "error" in before or "error" in after:
        return {}
    out = {}
    for key, value in after.items():
        old = before.get(key, 0)
        numbers = isinstance(value, int) and isinstance(old, int) and not isinstance(value, bool)
        if numbers and value != old:
            out[key] = value - old
    return out


def start(
    kind: str, directory: Path, label: str, rules: str, profile: Path | None = None
) -> BrokerProcess:
    """A topiary broker with the side-by-side's limits, and with ``kind == "acl"`` the
    rule file ``rules``; under cProfile, its stats written to ``profile``, if given."""
    config = TOPIARY_CONFIG
    if kind == "acl":
        acl = directory / f"{label}-rules.toml"
        acl.write_text(rules)
        config += f"\n[acl]\nfile = {json.dumps(str(acl))}\n"
    path = directory / f"{label}.toml"
    path.write_text(config)
    return start_broker(directory / f"{label}.log", config=path, profile=profile)


def run_one(
    kind: str,
    round_no: int,
    params: dict[str, Any],
    work: dict[str, Any],
    rules: list[dict[str, Any]],
    seed: int,
    ctx: Any,
    directory: Path,
) -> dict[str, Any]:
    """One fresh broker of ``kind``, its clients and the throughput phase; never raises
    for what the broker or a worker did (``error`` in the result). The broker's config,
    rules and log go to ``directory``."""
    label = f"round{round_no}-{kind}"
    result: dict[str, Any] = {
        "kind": kind,
        "round": round_no,
        "rules": len(rules) if kind == "acl" else 0,
        "load_average_start": os.getloadavg(),
    }
    broker: BrokerProcess | None = None
    workers: list[Worker] = []
    started = time.monotonic()
    messages = len(work["topics"])
    try:
        profile = Path(params["profile"]) / f"{label}.prof" if params.get("profile") else None
        broker = start(kind, directory, label, acl_toml(rules), profile)
        result["broker_pid"] = broker.pid
        subs = [
            Worker(
                ctx,
                subscriber_main,
                ("native", broker.port, conns, f"s{i}", OWN_FILTER),
                f"{kind}-s{i}",
            )
            for i, conns in enumerate(work["processes"])
        ]
        workers.extend(subs)
        pub = Worker(
            ctx,
            publisher_main,
            ("native", broker.port, messages, seed, PAYLOAD_SIZES, "pub"),
            f"{kind}-pub",
        )
        workers.append(pub)
        result["worker_pids"] = [w.pid for w in workers]
        ready = [w.expect("ready", WORKER_READY_TIMEOUT)[1] for w in workers]
        result["setup_seconds"] = time.monotonic() - started
        refused = sum(sum(r["refused"]) for r in ready[:-1])
        if refused:
            first = next(r["first_refusal"] for r in ready if r.get("first_refusal"))
            raise BenchError(f"{refused} filters refused, first: {first}")
        result["subscribed"] = sum(sum(r["subscribed"]) for r in ready[:-1])
        client_ids = [cid for r in ready[:-1] for cid in r["client_ids"]]
        connections = [
            [*filters, OWN_FILTER.format(client=cid)]
            for filters, cid in zip(work["ordered"], client_ids, strict=True)
        ]
        denies = [binding_denies(rules, cid) for cid in client_ids] if kind == "acl" else None
        owed = Owed.build(connections, work["topics"], denies)

        timeout = params["drain_timeout"] + messages / 10_000
        before = _stats(broker.port)
        cpu_before = cpu_seconds(broker.pid)
        for worker in subs:
            worker.send(("count", "a", timeout, False))
        for worker in subs:
            worker.expect("armed", 30)
        pub.send(("flood", "a", 0, messages))
        published = pub.expect("published", timeout + 30)[1]
        rows: list[dict[str, Any]] = []
        for worker in subs:
            rows.extend(worker.expect("result", timeout + 30)[1])
        pub.send(("enough",))
        markers = pub.expect("stopped", 30)[1]["markers"]
        broker_cpu = cpu_seconds(broker.pid) - cpu_before
        after = _stats(broker.port)

        sent, first = published["sent"], published["first_ns"]
        exact = exactness(rows, owed, sent)
        counters = counter_moves(before, after)
        last = [r["last_ns"] for r in rows if r["last_ns"] is not None]
        completion = (max(last) - first) / 1e9 if last else None
        result["throughput"] = {
            "messages": sent,
            "published_per_second": sent / max((published["barrier_ns"] - first) / 1e9, 1e-9),
            "completion_seconds": completion,
            "completion_per_second": sent / completion if completion else None,
            "delivered_per_second": exact["received"] / completion if completion else None,
            "deliveries_per_message": exact["received"] / sent if sent else None,
            "withheld": owed.withheld,
            "broker_denied": counters.get(DENIED_COUNTER, 0),
            "exactness": exact,
            "complete": all(r["marker_ns"] is not None for r in rows),
            "markers": markers,
            "publisher_cpu_seconds": published["cpu_seconds"],
            "broker_cpu_seconds": broker_cpu,
            "broker_counters": counters,
        }
        status = proc_status(broker.pid)
        result["broker_peak_rss_mb"] = status.get("VmHWM")
    except (BenchError, OSError, trio.TooSlowError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for worker in workers:
            worker.stop()
        if broker is not None:
            result["broker_stop"] = stop_broker(broker)
            result["broker_log_summary"] = scan_log(broker.log_path)
    result["seconds"] = time.monotonic() - started
    return result


# -- report ------------------------------------------------------------------------------------


def _rate(result: dict[str, Any] | None) -> float | None:
    """A run's completion msg/s if it is comparable: complete and exact."""
    tput = (result or {}).get("throughput")
    if not tput or not tput["complete"] or not tput["exactness"]["exact"]:
        return None
    return tput["completion_per_second"]


def round_ratios(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per round: acl msg/s / plain msg/s (None unless both are comparable), and the
    broker CPU seconds of acl / plain."""
    out = []
    for round_no in sorted({r["round"] for r in runs}):
        pair = {r["kind"]: r for r in runs if r["round"] == round_no}
        plain, acl = _rate(pair.get("plain")), _rate(pair.get("acl"))
        cpu = [(pair.get(k) or {}).get("throughput", {}).get("broker_cpu_seconds") for k in KINDS]
        out.append(
            {
                "round": round_no,
                "order": [r["kind"] for r in runs if r["round"] == round_no],
                "completion": acl / plain if acl and plain else None,
                "broker_cpu": cpu[1] / cpu[0] if cpu[0] and cpu[1] else None,
            }
        )
    return out


def summary(runs: list[dict[str, Any]], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    ratios = [r["completion"] for r in rounds if r["completion"] is not None]
    cpu = [r["broker_cpu"] for r in rounds if r["broker_cpu"] is not None]
    rates = {k: [x for r in runs if r["kind"] == k and (x := _rate(r))] for k in KINDS}
    return {
        "ratios": ratios,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "median_cpu_ratio": statistics.median(cpu) if cpu else None,
        "median_rate": {k: statistics.median(v) if v else None for k, v in rates.items()},
        "all_compared": len(ratios) == len(rounds),
    }


def check_goals(report: dict[str, Any]) -> Goals:
    params = report["parameters"]
    full = (
        not params["quick"]
        and params["messages"] == GOAL_MESSAGES
        and params["connections"] == GOAL_CONNECTIONS
        and params["rules"] == GOAL_RULES
    )
    value = report["summary"]["median_ratio"]
    met = value >= GOAL_RATIO if full and value is not None else None
    goals = Goals()
    goals.add(
        f"completion with {GOAL_RULES:,} rules >= {GOAL_RATIO:g}x without "
        f"({GOAL_CONNECTIONS:,} connections, {GOAL_MESSAGES:,} messages, median of the rounds)",
        value,
        met,
    )
    exact = [r["throughput"]["exactness"]["exact"] for r in report["runs"] if "throughput" in r]
    every = all(exact) and len(exact) == len(report["runs"]) if exact else None
    goals.add("every delivery exact (both brokers, every round)", every, every)
    if params["quick"]:
        goals[0]["note"] = "quick run: counts too small to judge"
    return goals


def _exact_cell(exact: dict[str, Any]) -> str:
    if exact["exact"]:
        return "yes"
    return f"NO {exact['missing']:,}/{exact['duplicates']:,}/{exact['unexpected']:,}"


def table_lines(report: dict[str, Any]) -> list[str]:
    """A row per run, the round's ratio on its acl row."""
    ratio_of = {r["round"]: r for r in report["rounds"]}
    head = (
        f"{'round':>5} {'broker':<6} {'rules':>5} {'conns':>5} {'setup s':>7} "
        f"{'published/s':>11} {'delivered/s':>11} {'complete s':>10} {'msg/s':>9} "
        f"{'acl/plain':>9} {'CPU s':>6} {'deliv/msg':>9} {'withheld':>8} {'exact':>10} "
        f"{'RSS MB':>7} {'load':>5}"
    )
    lines = [head, "-" * len(head)]
    for r in report["runs"]:
        label = f"{r['round']:>5} {r['kind']:<6} {r['rules']:>5}"
        if "throughput" not in r:
            lines.append(f"{label} failed: {brief(r.get('error', '?'), 100)}")
            continue
        a = r["throughput"]
        ratio = ratio_of[r["round"]]["completion"] if r["kind"] == "acl" else None
        longer, lower = ("", "") if a["complete"] else (">", "<")
        lines.append(
            f"{label} {a['exactness']['connections']:>5} {r['setup_seconds']:>7.2f} "
            f"{fmt(a['published_per_second'], ',.0f'):>11} "
            f"{fmt(a['delivered_per_second'], ',.0f'):>11} "
            f"{longer + fmt(a['completion_seconds'], '.3f'):>10} "
            f"{lower + fmt(a['completion_per_second'], ',.0f'):>9} "
            f"{fmt(ratio, '.3f') + ('x' if ratio else '') if r['kind'] == 'acl' else '':>9} "
            f"{a['broker_cpu_seconds']:>6.2f} "
            f"{fmt(a['deliveries_per_message'], '.2f'):>9} {a['withheld']:>8,} "
            f"{_exact_cell(a['exactness']):>10} "
            f"{fmt(r.get('broker_peak_rss_mb'), '.1f'):>7} {r['load_average_start'][0]:>5.2f}"
        )
    return lines


def notes(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for r in report["runs"]:
        tag = f"round {r['round']} {r['kind']}"
        if "error" in r:
            out.append(f"{tag}: FAILED: {brief(r['error'])}")
        a = r.get("throughput")
        if a:
            e = a["exactness"]
            if not e["exact"]:
                out.append(
                    f"{tag}: {e['received']:,} of {e['expected']:,} copies owed: "
                    f"{e['missing']:,} missing, {e['duplicates']:,} duplicated, "
                    f"{e['unexpected']:,} unexpected; connections {e['connections_off']}"
                )
            for error in e["errors"][:3]:
                out.append(f"{tag}: subscriber: {error}")
            dropped = a["broker_counters"].get("dropped")
            if dropped:
                out.append(f"{tag}: the broker dropped {dropped:,}")
            denied = a["broker_denied"]
            if a["broker_counters"] and denied != a["withheld"]:  # empty: no stats
                out.append(
                    f"{tag}: the broker counted {denied:,} deliveries denied "
                    f"({DENIED_COUNTER}), the reference withholds {a['withheld']:,}"
                )
            if not a["complete"]:
                out.append(f"{tag}: not every subscriber saw the marker")
        out += broker_notes(tag, r)
    return out


def _goal_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    return f"{value:,.3f}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(
        __doc__ or "", quick="40 connections, 4,000 messages, one round (a smoke test)"
    )
    parser.add_argument("--rounds", type=int, help="pairs of brokers, order alternating (3)")
    parser.add_argument("--messages", type=int, help="messages per run (200,000)")
    parser.add_argument("--connections", type=int, help="subscriber connections (1,000)")
    parser.add_argument("--rules", type=int, help="rules in the ACL file (1,000)")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument("--log-dir", help="keep the brokers' logs and configs here")
    parser.add_argument(
        "--client-deny",
        action="store_true",
        help="add deny subscribe on client/%%c/private/> for everyone: no two clients share "
        "their deny rules",
    )
    parser.add_argument(
        "--profile",
        metavar="DIR",
        help="run the brokers under cProfile, stats in DIR/roundN-KIND.prof (slower: "
        "for finding where the time goes, not for the figures)",
    )
    args = parser.parse_args(argv)
    for name, low in (("rounds", 1), ("messages", 1), ("connections", 2)):
        value = getattr(args, name)
        if value is not None and value < low:
            parser.error(f"--{name} must be >= {low}")
    least = len(binding_rules(args.client_deny))
    if args.rules is not None and args.rules < least:
        parser.error(f"--rules must be >= {least} (the rules that bind the clients)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    for name in ("rounds", "messages", "connections", "rules"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    params["processes"] = min(params["processes"], params["connections"])
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        params["profile"] = str(Path(args.profile).resolve())
    report: dict[str, Any] = {
        "benchmark": "acl",
        "machine": machine_info(trio=trio.__version__),
        "parameters": {
            **params,
            "quick": args.quick,
            "seed": args.seed,
            "client_deny": args.client_deny,
            "filters_per_connection": FILTERS_PER_CONNECTION,
            "payload_sizes": list(PAYLOAD_SIZES),
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runs": [],
    }
    started = time.monotonic()
    print(
        f"acl: {report['machine']['cpu_count']} CPUs, Python {report['machine']['python']}, "
        f"load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    work = plan(params, args.seed)
    rules = rule_set(params["rules"], args.seed, args.client_deny)
    report["filters"] = work["filters"]
    report["rule_kinds"] = dict(
        Counter(f"{r['who'].split(':')[0]} {'allow' if 'allow' in r else 'deny'}" for r in rules)
    )
    ctx = multiprocessing.get_context("spawn")
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix="topiary-acl-bench-")
    log_dir = Path(args.log_dir or temp_dir)  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        for round_no in range(1, params["rounds"] + 1):
            order = KINDS if round_no % 2 else KINDS[::-1]
            for kind in order:
                print(f"  round {round_no}: {kind} ...", flush=True)
                result = run_one(kind, round_no, params, work, rules, args.seed, ctx, log_dir)
                if "error" in result:
                    failed = True
                    print(f"  {kind} failed: {result['error']}", file=sys.stderr, flush=True)
                report["runs"].append(result)
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["rounds"] = round_ratios(report["runs"])
    report["summary"] = summary(report["runs"], report["rounds"])
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = time.monotonic() - started
    report["goals"] = check_goals(report)
    report["notes"] = notes(report)
    print()
    for line in table_lines(report):
        print(line)
    print()
    s = report["summary"]
    print(
        f"{len(rules):,} rules ({len(binding_rules(args.client_deny))} for everyone, the rest "
        "for principals "
        f"not connected); {params['connections']:,} connections holding the first "
        f"{work['filters']['kept']:,} portable workload filters ({FILTERS_PER_CONNECTION} "
        f"each) + their client/ID/> + the control topic; {params['messages']:,} messages of "
        f"{PAYLOAD_SIZES[0]}-{PAYLOAD_SIZES[1]} B as fast as the publisher writes; complete "
        "s = first publish -> last delivery; msg/s = messages / complete s; acl/plain = the "
        "round's ratio of msg/s; CPU s = the broker's, over the phase; withheld = copies the "
        "connections' filters match that a deny rule withholds (not owed); exact = "
        "missing/duplicated/unexpected copies; setup s = broker start -> every client "
        "subscribed"
    )
    ratios = ", ".join(f"{x:.3f}x" for x in s["ratios"]) or "-"
    print(
        f"acl / plain msg/s by round: {ratios}; median {fmt(s['median_ratio'], '.3f')}; "
        f"broker CPU acl / plain, median: {fmt(s['median_cpu_ratio'], '.3f')}"
    )
    print_ending(report, _goal_value)
    write_report(report, args.json, sort_keys=False)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
