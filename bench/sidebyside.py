"""Filtered fan-out and latency side by side: topiary, Mosquitto and NATS with the same clients.

    python bench/sidebyside.py [--quick] [--json PATH] [--brokers topiary,mosquitto,nats]
                               [--sizes 1000,10000] [--messages N] [--seed N] [--log-dir DIR]

Issue 18's second measure: how fast a broker fans a stream out to filtered subscribers,
and how quickly it delivers at a modest rate, beside Mosquitto and nats-server (when
installed: ``apt-get install mosquitto nats-server``), with the same Python clients
(bench/harness/clients: one trio shell, one lean codec per protocol), the same process
layout and a fresh broker per kind and size (bench/harness/peers.py says how each is
configured).

Per size S (1,000 and 10,000 filters):

- Subscribers: 4 connections in 2 processes holding between them the first S portable
  filters of ``workload.subscriptions(.., seed)`` (prefix wildcards, which MQTT and NATS
  cannot express, are skipped and counted; MQTT-dialect ``+``/``#`` are rewritten as
  ``*``/``>``, counted; see bench/harness/clients/topics.py), round-robin (connection k holds
  filters k::4, so the platform-wide ones such as ``beacon/>`` land on different
  connections), plus the control topic.
- Publisher: one connection publishing ``workload.topics(200,000, seed)`` in order, payloads
  of 200-800 bytes (sizes drawn uniformly, deterministically from the seed, the same for
  every broker; bytes 0-15 carry a timestamp and the message's index).

a. Throughput: 200,000 messages as fast as the publisher can write them (256 per write),
   then a PING round trip (the broker has read them all) and a marker on the control topic
   (repeated every 100 ms until every subscriber has one). Completion = first publish ->
   the last delivery (the read that brought the last message to any subscriber);
   completion msg/s = messages / completion; delivered/s = deliveries / completion;
   published/s = messages / (first publish -> the PING's answer).
b. Latency: 2,000 msg/s for 2.5 s on an absolute schedule (message i due at start + i /
   2,000; trio sleeps in whole milliseconds, so a wake-up writes what is due); latency =
   the read time at the subscriber - the time the message's batch was built, p50 / p99 /
   max over every delivery. "from schedule" (read time - due time) adds the publisher's
   timer slack (~1 ms) and any hold-up by the broker.

Exactness, per phase: each connection's received copies against those it is owed (the
published topics matched against its filters with ``routing.SubscriptionTable``: one copy
per connection for topiary and Mosquitto, one per matching filter for NATS, which sends a
MSG per matching subscription), message by message: missing, duplicated, unexpected. Under
QoS 0 a broker may drop when a subscriber falls behind (topiary past 10,000 queued messages
per connection, NATS by closing a slow consumer past 256 MiB; Mosquitto is configured not
to); drops are counted and reported, not a failure, but a completion time with drops is
not comparable and the table says so. Per broker also its peak RSS (VmHWM) and CPU
seconds (/proc).

Ratios: topiary / each peer, for completion msg/s (> 1: topiary faster) and for the p99
(< 1: topiary quicker). Goals (issue 18, for topiary; for information, they do not set the
exit status): completion >= 1.0x NATS at S = 1,000 and 10,000; p99 at 2,000 msg/s <=
Mosquitto's in the same run; every delivery exact. ``--brokers`` may also name
``topiary-mqtt`` (topiary's MQTT port, with Mosquitto's MQTT client; its row's ratios are
topiary / topiary-mqtt); bench/mqtt_sidebyside.py is the same run with the ratios and
goals of topiary-mqtt against Mosquitto (issue 17). ``relay-trio`` and ``relay-epoll`` are
the reference relays of bench/harness/relay.py (the least a Python process does per
message): the floor of the latency figures. Each latency phase notes how the kernel ran
the broker (CPU ms, ms waiting for a CPU, times preempted: ``broker_scheduling``).

``--quick``: 4,000 messages and a 0.5 s latency phase (a smoke test). Every wait is
bounded: a broker that fails or a worker that hangs gives an error row, not a hang; a
throughput phase whose marker has not reached every subscriber within 60 s + 1 s per
10,000 messages is cut short, its row marked (``>`` complete s, ``<`` msg/s), and the
latency phase is skipped (an error: the broker would still be delivering). The
exit status is 0 unless a run failed to complete. Everything shares the machine: on 2
cores the Python clients compete with the broker for CPU, the same for every broker.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from bench.harness import BenchError, peers  # noqa: E402
from bench.harness.crossload import (  # noqa: E402
    Expectation,
    brief,
    latency_summary,
    portable_subscriptions,
    publisher_main,
    publisher_topics,
    split,
    subscriber_main,
)
from bench.harness.processes import broker_stats  # noqa: E402
from bench.harness.procfs import cpu_seconds, proc_status, scheduling  # noqa: E402
from bench.harness.report import (  # noqa: E402
    Goals,
    arg_parser,
    fmt,
    print_ending,
    write_report,
)
from bench.harness.report import machine_info as common_machine_info  # noqa: E402
from bench.harness.workers import Worker  # noqa: E402

PAYLOAD_SIZES = (200, 800)
WORKER_READY_TIMEOUT = 120.0
LATENCY_OFFSET = 1_000_000_000  # phase b's message indices start here
GOAL_VS_NATS = 1.0
GOAL_SIZES = (1_000, 10_000)
GOAL_MESSAGES = 200_000

FULL: dict[str, Any] = {
    "sizes": list(GOAL_SIZES),
    "messages": GOAL_MESSAGES,
    "latency_rate": 2_000,
    "latency_seconds": 2.5,
    "connections": 4,
    "processes": 2,
    "drain_timeout": 60.0,
}
QUICK: dict[str, Any] = {
    **FULL,
    "messages": 4_000,
    "latency_seconds": 0.5,
    "drain_timeout": 20.0,
}


# -- one broker, one size ----------------------------------------------------------------------


def _indices(row: dict[str, Any], key: str = "indices") -> array:
    values = array("q")
    values.frombytes(row[key])
    return values


def _exactness(
    rows: list[dict[str, Any]], expectation: Expectation, sent: int, offset: int
) -> dict[str, Any]:
    conns = []
    for k, row in enumerate(rows):
        check = expectation.check(k, _indices(row), sent, offset)
        check["error"] = row["error"]
        check["late"] = row["late"]
        conns.append(check)
    totals = {
        key: sum(c[key] for c in conns)
        for key in ("expected", "received", "missing", "duplicates", "unexpected")
    }
    exact = all(c["error"] is None for c in conns) and (
        totals["missing"] == totals["duplicates"] == totals["unexpected"] == 0
    )
    return {"exact": exact, **totals, "connections": conns}


def _topiary_stats(port: int) -> dict[str, Any] | None:
    try:
        return broker_stats(port)
    except Exception as exc:  # a broker that no longer answers: recorded, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def _dropped(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    if not before or not after or "error" in before or "error" in after:
        return {}
    keys = ("dropped", "slow_consumer_disconnects", "messages_in", "messages_out")
    return {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}


class Run:
    """The workers of one broker and one size, and the phases they go through."""

    def __init__(self, subs: list[Worker], pub: Worker, broker: peers.RunningBroker) -> None:
        self.subs = subs
        self.pub = pub
        self.broker = broker

    def phase(self, name: str, command: tuple, timeout: float, latency: bool) -> dict[str, Any]:
        stats_port = self.broker.stats_port  # topiary's native port, whatever the front end
        before = _topiary_stats(stats_port) if stats_port else None
        cpu_before = cpu_seconds(self.broker.pid)
        sched_before = scheduling(self.broker.pid)
        for worker in self.subs:
            worker.send(("count", name, timeout, latency))
        for worker in self.subs:
            worker.expect("armed", 30)
        self.pub.send(command)
        published = self.pub.expect("published", timeout + 30)[1]
        rows: list[dict[str, Any]] = []
        sub_cpu = 0.0
        for worker in self.subs:
            _, results, cpu = worker.expect("result", timeout + 30)
            rows.extend(results)
            sub_cpu += cpu
        self.pub.send(("enough",))
        markers = self.pub.expect("stopped", 30)[1]["markers"]
        broker_cpu = cpu_seconds(self.broker.pid) - cpu_before
        sched_after = scheduling(self.broker.pid)
        after = _topiary_stats(stats_port) if stats_port else None
        published.pop("late_batches", None)
        published.pop("long_writes", None)
        return {
            "published": published,
            "rows": rows,
            "markers": markers,
            "broker_cpu_seconds": broker_cpu,
            # how the kernel ran the broker meanwhile (ms on a CPU, ms waiting for one,
            # times preempted): on 2 shared cores, waits make the latency's tail
            "broker_scheduling": {
                k: sched_after[k] - sched_before[k] for k in sched_after if k in sched_before
            },
            "subscriber_cpu_seconds": sub_cpu,
            "broker_counters": _dropped(before, after),
        }


def _throughput(raw: dict[str, Any], expectation: Expectation) -> dict[str, Any]:
    published, rows = raw["published"], raw["rows"]
    sent, first = published["sent"], published["first_ns"]
    exact = _exactness(rows, expectation, sent, 0)
    last = [r["last_ns"] for r in rows if r["last_ns"] is not None]
    completion = (max(last) - first) / 1e9 if last else None
    return {
        "messages": sent,
        "published_per_second": sent / max((published["barrier_ns"] - first) / 1e9, 1e-9),
        "completion_seconds": completion,
        "completion_per_second": sent / completion if completion else None,
        "delivered_per_second": exact["received"] / completion if completion else None,
        "deliveries_per_message": exact["received"] / sent if sent else None,
        "exactness": exact,
        "complete": all(r["marker_ns"] is not None for r in rows),
        "markers": raw["markers"],
        "publisher_cpu_seconds": published["cpu_seconds"],
        "subscriber_cpu_seconds": raw["subscriber_cpu_seconds"],
        "broker_cpu_seconds": raw["broker_cpu_seconds"],
        "broker_counters": raw["broker_counters"],
    }


def _latency(raw: dict[str, Any], expectation: Expectation) -> dict[str, Any]:
    published, rows = raw["published"], raw["rows"]
    start_ns, rate, offset = published["start_ns"], published["rate"], published["offset"]
    per_ns = 1e9 / rate
    send: list[int] = []
    schedule: list[int] = []
    for row in rows:
        indices, sent_ns, read_ns = (
            _indices(row),
            _indices(row, "sent_ns"),
            _indices(row, "read_ns"),
        )
        for index, sent, read in zip(indices, sent_ns, read_ns, strict=True):
            send.append(read - sent)
            schedule.append(read - start_ns - int((index - offset) * per_ns))
    return {
        "rate": rate,
        "messages": published["sent"],
        "achieved_rate": published["achieved_rate"],
        "publisher_lag_ms": published["lag_ms"],
        "publisher_blocked_ms": published["blocked_ms"],
        "latency_ms": latency_summary(send),
        "from_schedule_ms": latency_summary(schedule),
        "exactness": _exactness(rows, expectation, published["sent"], offset),
        "complete": all(r["marker_ns"] is not None for r in rows),
        "broker_cpu_seconds": raw["broker_cpu_seconds"],
        "broker_scheduling": raw["broker_scheduling"],
        "broker_counters": raw["broker_counters"],
    }


def run_one(
    kind: str,
    size: int,
    params: dict[str, Any],
    plan: dict[str, Any],
    seed: int,
    ctx: Any,
    log_dir: Path,
) -> dict[str, Any]:
    """One broker of ``kind`` holding ``size`` filters: both phases; never raises for what
    the broker or a worker did (``error`` in the result)."""
    result: dict[str, Any] = {"kind": kind, "size": size, "installed": peers.installed(kind)}
    if not result["installed"]:
        return result
    result["version"] = peers.version(kind)
    result["load_average_start"] = os.getloadavg()  # brokers run one after the other
    result["delivery"] = peers.DELIVERY[kind]
    protocol = peers.PROTOCOL[kind]
    broker: peers.RunningBroker | None = None
    workers: list[Worker] = []
    started = time.monotonic()
    messages = params["messages"]
    try:
        broker = peers.start(kind, log_dir, f"sidebyside-{size}-{kind}")
        result["broker_pid"] = broker.pid
        result["broker_log"] = str(broker.log_path)
        subs = [
            Worker(ctx, subscriber_main, (protocol, broker.port, conns, f"s{i}"), f"{kind}-s{i}")
            for i, conns in enumerate(plan["processes"])
        ]
        workers.extend(subs)
        pub = Worker(
            ctx,
            publisher_main,
            (protocol, broker.port, plan["topic_count"], seed, PAYLOAD_SIZES, "pub"),
            f"{kind}-pub",
        )
        workers.append(pub)
        result["worker_pids"] = [w.pid for w in workers]
        ready = [w.expect("ready", WORKER_READY_TIMEOUT)[1] for w in workers]
        refused = sum(sum(r["refused"]) for r in ready[:-1])
        if refused:
            first = next(r["first_refusal"] for r in ready if r.get("first_refusal"))
            raise BenchError(f"{refused} filters refused, first: {first}")
        result["subscribed"] = sum(sum(r["subscribed"]) for r in ready[:-1])
        result["setup_seconds"] = time.monotonic() - started
        run = Run(subs, pub, broker)
        expectation = plan["expectations"][peers.DELIVERY[kind]]

        timeout = params["drain_timeout"] + messages / 10_000
        raw = run.phase("a", ("flood", "a", 0, messages), timeout, latency=False)
        result["throughput"] = _throughput(raw, expectation)
        if not result["throughput"]["complete"]:  # the broker is still working through it
            raise BenchError(
                f"the throughput phase did not finish within {timeout:g} s; latency phase "
                "skipped (it would measure the backlog)"
            )

        rate, seconds = params["latency_rate"], params["latency_seconds"]
        count = round(rate * seconds)
        command = ("paced", "b", LATENCY_OFFSET, rate, seconds + 5, count)
        raw = run.phase("b", command, seconds + params["drain_timeout"], latency=True)
        result["latency"] = _latency(raw, expectation)

        status = proc_status(broker.pid)
        result["broker_peak_rss_mb"] = status.get("VmHWM")
        result["broker_rss_mb"] = status.get("VmRSS")
        errors = [
            c["error"]
            for phase in ("throughput", "latency")
            for c in result[phase]["exactness"]["connections"]
            if c["error"]
        ]
        result["subscriber_errors"] = errors
    except (BenchError, OSError, trio.TooSlowError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        for worker in workers:
            worker.stop()
        if broker is not None:
            result["broker_stop"] = peers.stop(broker)
            result["broker_log_summary"] = peers.log_summary(broker)
    result["seconds"] = time.monotonic() - started
    return result


# -- the plan ----------------------------------------------------------------------------------


def make_plan(
    size: int, params: dict[str, Any], seed: int, kinds: list[str], topics: list[str]
) -> dict[str, Any]:
    filters, drawn = portable_subscriptions(size, seed)
    conns = split(filters, params["connections"])
    processes = split(conns, params["processes"])
    ordered = [conn for process in processes for conn in process]  # the rows' order
    deliveries = sorted({peers.DELIVERY[k] for k in kinds if peers.installed(k)})
    return {
        "processes": processes,
        "topic_count": len(topics),
        "expectations": Expectation.build(ordered, topics, deliveries),
        "filters": {**drawn, "kept": len(filters)},
    }


# -- report ------------------------------------------------------------------------------------


def _comparable(result: dict[str, Any]) -> bool:
    """A completion time to compare: every delivery made, none dropped."""
    tput = result.get("throughput")
    return bool(tput and tput["exactness"]["exact"])


def ratios(results: dict[str, dict[str, Any]], ours: str = "topiary") -> dict[str, dict[str, Any]]:
    """``ours`` (topiary or topiary-mqtt) / each other broker: completion msg/s and p99; None
    where one side is missing."""
    reference = ours
    ours = results.get(reference, {})
    out = {}
    for kind, theirs in results.items():
        if kind == reference or not theirs.get("installed"):
            continue
        mine = (ours.get("throughput") or {}).get("completion_per_second")
        other = (theirs.get("throughput") or {}).get("completion_per_second")
        my_p99 = ((ours.get("latency") or {}).get("latency_ms") or {}).get("p99")
        their_p99 = ((theirs.get("latency") or {}).get("latency_ms") or {}).get("p99")
        out[kind] = {
            "completion": mine / other if mine and other else None,
            "completion_comparable": _comparable(ours) and _comparable(theirs),
            "p99": my_p99 / their_p99 if my_p99 and their_p99 else None,
        }
    return out


def _exact_cell(exact: dict[str, Any] | None) -> str:
    if not exact:
        return "-"
    if exact["exact"]:
        return "yes"
    return f"NO {exact['missing']:,}/{exact['duplicates']:,}/{exact['unexpected']:,}"


def table_lines(report: dict[str, Any]) -> list[str]:
    """The table: a row per size and broker, the ratios (``parameters.ours`` / the row's
    broker) on the other brokers' rows, then a line per broker not installed."""
    ours = report["parameters"].get("ours", "topiary")
    missing: dict[str, None] = {}
    head = (
        f"{'S':>6} {'broker':<12} {'published/s':>11} {'delivered/s':>11} {'complete s':>10} "
        f"{'msg/s':>9} {'top/peer':>8} {'CPU s':>5} {'deliv/msg':>9} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7} {'p99 t/p':>7} {'exact tput':>12} {'exact lat':>10} {'RSS MB':>7} "
        f"{'load':>5}"
    )
    lines = [head, "-" * len(head)]
    for size_key, by_kind in report["sizes"].items():
        size = int(size_key)
        rel = report["ratios"].get(size_key, {})
        for kind, r in by_kind.items():
            label = f"{size:>6,} {kind:<12}"
            if not r["installed"]:
                lines.append(f"{label} not installed ({peers.install_hint(kind)})")
                missing[kind] = None
                continue
            if "throughput" not in r:
                lines.append(f"{label} failed: {brief(r.get('error', '?'), 100)}")
                continue
            a = r["throughput"]
            b = r.get("latency") or {}
            lat = b.get("latency_ms") or {}
            ratio = rel.get(kind, {})
            completion = fmt(ratio.get("completion"), ".2f") + (
                "x" if ratio.get("completion") else ""
            )
            if ratio and not ratio.get("completion_comparable") and ratio.get("completion"):
                completion += "*"
            p99_ratio = fmt(ratio.get("p99"), ".2f") + ("x" if ratio.get("p99") else "")
            # a phase cut short by its time bound: it took longer, its rate is lower
            longer, lower = ("", "") if a["complete"] else (">", "<")
            lines.append(
                f"{label} {fmt(a['published_per_second'], ',.0f'):>11} "
                f"{fmt(a['delivered_per_second'], ',.0f'):>11} "
                f"{longer + fmt(a['completion_seconds'], '.3f'):>10} "
                f"{lower + fmt(a['completion_per_second'], ',.0f'):>9} "
                f"{completion if kind != ours else '':>8} "
                f"{a['broker_cpu_seconds']:>5.2f} "
                f"{fmt(a['deliveries_per_message'], '.2f'):>9} "
                f"{fmt(lat.get('p50'), '.2f'):>7} {fmt(lat.get('p99'), '.2f'):>7} "
                f"{fmt(lat.get('max'), '.2f'):>7} "
                f"{p99_ratio if kind != ours else '':>7} "
                f"{_exact_cell(a['exactness']):>12} {_exact_cell(b.get('exactness')):>10} "
                f"{fmt(r.get('broker_peak_rss_mb'), '.1f'):>7} "
                f"{r['load_average_start'][0]:>5.2f}"
            )
    lines.extend(f"{kind}: not installed ({peers.install_hint(kind)})" for kind in missing)
    return lines


def check_goals(report: dict[str, Any]) -> Goals:
    params = report["parameters"]
    comparable = params["messages"] == GOAL_MESSAGES and not params["quick"]
    goals = Goals()
    for size in GOAL_SIZES:
        key = str(size)
        ratio = report["ratios"].get(key, {}).get("nats", {})
        value = ratio.get("completion")
        ok = None
        if comparable and value is not None and ratio.get("completion_comparable"):
            ok = value >= GOAL_VS_NATS
        goals.add(
            f"S = {size:,}: completion >= {GOAL_VS_NATS:g}x NATS' rate "
            f"({GOAL_MESSAGES:,} messages, none dropped)",
            value,
            ok,
        )
    for size in params["sizes"]:
        key = str(size)
        value = report["ratios"].get(key, {}).get("mosquitto", {}).get("p99")
        goals.add(
            f"S = {size:,}: p99 at {params['latency_rate']:,} msg/s <= Mosquitto's (ratio <= 1)",
            value,
            None if value is None or params["quick"] else value <= 1.0,
        )
    add_exact_goal(goals, report, "topiary")
    return goals


def add_exact_goal(goals: Goals, report: dict[str, Any], kind: str) -> None:
    """The last goal: every delivery of ``kind`` exact; a quick run's other goals get a note
    that its counts are too small to judge."""
    exact = [
        r[phase]["exactness"]["exact"]
        for by_kind in report["sizes"].values()
        for name, r in by_kind.items()
        if name == kind
        for phase in ("throughput", "latency")
        if phase in r
    ]
    value = all(exact) if exact else None
    goals.add(f"every {kind} delivery exact (both phases, every S)", value, value)
    if report["parameters"]["quick"]:
        for goal in goals[:-1]:
            goal["note"] = "quick run: counts too small to judge"


def notes(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    for size_key, by_kind in report["sizes"].items():
        for kind, r in by_kind.items():
            tag = f"S = {int(size_key):,} {kind}"
            if not r["installed"]:
                out.append(f"{tag}: not installed ({peers.install_hint(kind)}); skipped")
                continue
            if "error" in r:
                out.append(f"{tag}: FAILED: {brief(r['error'])}")
            for phase in ("throughput", "latency"):
                p = r.get(phase)
                if not p:
                    continue
                e = p["exactness"]
                if not e["exact"]:
                    out.append(
                        f"{tag} {phase}: {e['received']:,} of {e['expected']:,} copies owed: "
                        f"{e['missing']:,} missing, {e['duplicates']:,} duplicated, "
                        f"{e['unexpected']:,} unexpected"
                    )
                counters = p.get("broker_counters") or {}
                if counters.get("dropped"):
                    out.append(f"{tag} {phase}: the broker dropped {counters['dropped']:,}")
                if counters.get("slow_consumer_disconnects"):
                    out.append(
                        f"{tag} {phase}: {counters['slow_consumer_disconnects']} slow-consumer "
                        "disconnects"
                    )
                if not p["complete"]:
                    out.append(f"{tag} {phase}: not every subscriber saw the marker")
                sched = p.get("broker_scheduling") or {}
                if phase == "latency" and "run_ms" in sched:
                    out.append(
                        f"{tag} latency: the broker ran {sched['run_ms']:,.0f} ms, waited "
                        f"{sched['wait_ms']:,.0f} ms for a CPU, preempted "
                        f"{sched.get('preempted', 0):,.0f} times"
                    )
            for error in r.get("subscriber_errors", [])[:3]:
                out.append(f"{tag}: subscriber: {error}")
            summary = r.get("broker_log_summary", {})
            if summary.get("problem_count"):
                out.append(
                    f"{tag}: broker log has {summary['problem_count']} problem lines, first: "
                    f"{summary['problems'][0][:200]}"
                )
            stop = r.get("broker_stop", {})
            expected_status = (0, 1) if kind == "nats" else (0,)  # nats-server exits 1 on TERM
            if stop.get("killed") or stop.get("exit_status") not in (*expected_status, None):
                out.append(f"{tag}: broker stop: {stop}")
    return out


@dataclass(frozen=True)
class Comparison:
    """What a side-by-side run is for: its name, which broker the ratios are of (``ours``),
    which brokers run unless ``--brokers`` says otherwise, and its goals."""

    benchmark: str
    doc: str
    ours: str
    default_kinds: tuple[str, ...]
    goals: Callable[[dict[str, Any]], Goals]


ISSUE_18 = Comparison("sidebyside", __doc__ or "", "topiary", peers.KINDS, check_goals)


def parse_args(argv: list[str] | None, comparison: Comparison = ISSUE_18) -> argparse.Namespace:
    parser = arg_parser(
        comparison.doc, quick="4,000 messages, a 0.5 s latency phase (a smoke test)"
    )
    parser.add_argument(
        "--brokers",
        default=",".join(comparison.default_kinds),
        help=f"comma-separated broker kinds, of {', '.join(peers.ALL_KINDS)} (default: "
        "%(default)s; missing ones are reported as not installed)",
    )
    parser.add_argument("--sizes", help="comma-separated filter counts S (default: 1000,10000)")
    parser.add_argument("--messages", type=int, help="messages in the throughput phase")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument("--log-dir", help="keep the brokers' logs here (default: removed)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.brokers.split(",") if k.strip()]
    unknown = sorted(set(kinds) - set(peers.ALL_KINDS))
    if unknown or not kinds:
        parser.error(f"unknown brokers {unknown}; known: {', '.join(peers.ALL_KINDS)}")
    args.kinds = [k for k in peers.ALL_KINDS if k in kinds]
    if args.sizes is not None:
        try:
            args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
        except ValueError:
            parser.error("--sizes takes comma-separated integers")
        if not args.sizes or min(args.sizes) < 1:
            parser.error("--sizes must be >= 1")
    if args.messages is not None and args.messages < 1:
        parser.error("--messages must be >= 1")
    return args


def _goal_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "-" if value is None else str(value)
    return f"{value:,.3f}"


def main(argv: list[str] | None = None, comparison: Comparison = ISSUE_18) -> int:
    args = parse_args(argv, comparison)
    ours = comparison.ours
    params = dict(QUICK if args.quick else FULL)
    if args.sizes is not None:
        params["sizes"] = args.sizes
    if args.messages is not None:
        params["messages"] = args.messages
    ctx = multiprocessing.get_context("spawn")
    report: dict[str, Any] = {
        "benchmark": comparison.benchmark,
        "machine": common_machine_info(
            trio=trio.__version__, **{k: peers.version(k) for k in args.kinds}
        ),
        "parameters": {
            **params,
            "quick": args.quick,
            "seed": args.seed,
            "brokers": args.kinds,
            "ours": ours,
            "payload_sizes": list(PAYLOAD_SIZES),
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "filters": {},
        "sizes": {},
    }
    started = time.monotonic()
    print(
        f"{comparison.benchmark}: {report['machine']['cpu_count']} CPUs, Python "
        f"{report['machine']['python']}, load average "
        f"{' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    latency_count = round(params["latency_rate"] * params["latency_seconds"])
    topics = publisher_topics(max(params["messages"], latency_count), args.seed)
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix=f"topiary-{comparison.benchmark}-")
    log_dir = Path(args.log_dir or temp_dir)  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        for size in params["sizes"]:
            plan = make_plan(size, params, args.seed, args.kinds, topics)
            report["filters"][str(size)] = plan["filters"]
            by_kind: dict[str, Any] = {}
            for kind in args.kinds:
                if not peers.installed(kind):
                    by_kind[kind] = {"kind": kind, "size": size, "installed": False}
                    continue
                print(f"  S = {size:,}: running {kind} ...", flush=True)
                result = run_one(kind, size, params, plan, args.seed, ctx, log_dir)
                if "error" in result:
                    failed = True
                    print(f"  {kind} failed: {result['error']}", file=sys.stderr, flush=True)
                by_kind[kind] = result
            report["sizes"][str(size)] = by_kind
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["ratios"] = {size: ratios(by_kind, ours) for size, by_kind in report["sizes"].items()}
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = time.monotonic() - started
    report["goals"] = comparison.goals(report)
    report["notes"] = notes(report)
    print()
    for line in table_lines(report):
        print(line)
    print()
    for size_key, drawn in report["filters"].items():
        print(
            f"S = {int(size_key):,}: the first {drawn['kept']:,} portable filters of "
            f"{drawn['drawn']:,} workload entries drawn ({drawn['dropped']:,} prefix wildcards "
            f"skipped, {drawn['mapped']:,} MQTT-dialect mapped to */>, {drawn['duplicates']:,} "
            "duplicates after mapping skipped)"
        )
    print(
        f"throughput: {params['messages']:,} messages of {PAYLOAD_SIZES[0]}-{PAYLOAD_SIZES[1]} B "
        "as fast as the publisher writes; complete s = first publish -> last delivery; msg/s "
        f"= messages / complete s (>/<: the phase hit its time bound before every "
        f"subscriber had the marker); top/peer = {ours}'s msg/s / the row's (* = a side "
        "dropped or did not finish: not comparable); CPU s = the broker's CPU seconds in the "
        "throughput phase (/proc: "
        f"less sensitive to the machine's load than the rates); latency: "
        f"{params['latency_rate']:,} msg/s for "
        f"{params['latency_seconds']:g} s; p99 t/p = {ours}'s p99 / the row's; exact = "
        "missing/duplicated/unexpected copies; NATS sends a copy per matching filter "
        "(deliv/msg); load = the machine's 1-minute load average when the row's run started"
    )
    print_ending(report, _goal_value)
    write_report(report, args.json, sort_keys=False)  # the brokers in their order
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
