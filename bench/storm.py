"""Storm under traffic: one connection subscribes and unsubscribes 50,000 filters on a live broker.

    python bench/storm.py [--quick] [--json PATH] [--brokers topiary,mosquitto,nats]
                          [--rate R] [--storm-filters N] [--storm-hits] [--seed N]
                          [--log-dir DIR]

Issue 18 ("Fair service: storms and slow readers never hurt anyone else"): does a burst of
subscription changes on one connection delay everybody else's messages? Run on topiary and,
when installed (``apt-get install mosquitto nats-server``), on Mosquitto and nats-server,
with the same Python clients (bench/harness/clients: one trio shell, one lean codec per
protocol) and the same process layout, one fresh broker per kind (bench/harness/peers.py
says how each is configured), one table with the brokers side by side. ``--brokers`` also
takes ``relay-trio`` and ``relay-epoll`` (bench/harness/relay.py): not brokers, the least a
Python process does per message, to show the floor of the latency goals on this machine.

Parties, each a process of its own (spawn), coordinated through pipes by this script:

- Bystanders: 4 subscriber connections in 2 processes, holding between them the first 1,000
  portable filters of ``workload.subscriptions(.., seed)`` (prefix wildcards, which MQTT and
  NATS cannot express, are skipped; MQTT-dialect ``+``/``#`` become ``*``/``>``; see
  bench/harness/clients/topics.py), round-robin (connection k holds filters k::4, so the
  platform-wide ones such as ``beacon/>`` land on different connections), plus the control
  topic. They record every message's index, the publisher's timestamp and the time the
  read that brought it returned.
- Publisher: one connection publishing ``workload.topics(100,000, seed)`` in order
  (cycling), 256-byte payloads, paced at R msg/s (20,000 by default) on an absolute
  schedule: message i is due at start + i / R; every wake-up writes all messages due in one
  batch (trio sleeps in whole milliseconds, so about R / 1,000 per write). Bytes 0-7 of a
  payload: ``time.monotonic_ns()`` when its batch was built; bytes 8-15: its index.
- Storm: one connection that, after the warm-up, subscribes N distinct filters (50,000 by
  default) in one pipelined write and waits for every answer (time: first byte sent -> last
  answer read), then unsubscribes them all the same way. Its filters are portable workload
  tenants' filters (``prefix="storm"``) on sites the traffic never names (sites 20,000 and
  up of a larger world: ``workload.world`` appends them), so the storm is pure subscription
  churn in the same trie levels, and the storm connection receives nothing (checked: the
  filters are matched against every topic published, and the connection counts what it
  gets). ``--storm-hits`` draws them on the traffic's own sites instead; the storm
  connection then reads (and counts) what they match while they exist.

Timeline: warm-up (3 s; the first 0.5 s, connections settling, are not measured), storm,
tail (2 s), then the publisher stops, makes a PING round trip and publishes a marker on the
control topic every 100 ms; each bystander reads until its first marker (the brokers keep
one publisher's order per subscriber, so it then has every earlier message not dropped).

Reported per broker:

- storm subscribe / unsubscribe seconds (and answers refused);
- bystanders' latency (read time - publish timestamp) p50 / p99 / max, by phase of the
  message's due time: during the storm (first SUB byte sent .. last UNSUB answer), outside
  it (the warm-up) and after it (the tail); also "from schedule" (read time - due time):
  it adds the publisher's own timer slack (up to ~1 ms) but also any time the broker held
  the publisher up by not reading it, which the publish timestamp cannot show;
- the publisher's achieved rate, how far it fell behind its schedule (lag p99 / max;
  "behind" when a batch went out more than 20 ms late) and how long its writes blocked
  (a broker that stops reading its publisher; max and total);
- exactness: each bystander's received copies against those it is owed (the published
  topics matched against its filters with ``routing.SubscriptionTable``; one copy per
  connection for topiary and Mosquitto, one per matching filter for NATS), message by
  message: missing, duplicated, unexpected;
- the broker's peak RSS (VmHWM) and CPU seconds (/proc); for topiary also its ``stats``
  counters (dropped, slow-consumer disconnects, subscribes, table entries).

Goals (issue 18, for topiary; checked for information, they do not set the exit status):
bystanders' p99 during the storm <= 10 ms and <= 1.5x Mosquitto's in the same run, both
judged from the schedule (a broker that stops reading its publisher during the storm
delays those messages too; the publish stamp would hide it, and the timer slack the
schedule adds is small beside 10 ms); p99 outside the storm <= 1 ms, from the publish
stamp (there the slack would be as large as the goal; the publisher's lag is reported);
storm subscribe and unsubscribe each <= 1.0 s (50,000 filters, 20,000 msg/s); every
bystander delivery exact.

``--quick``: 5,000 storm filters, 5,000 msg/s, 1 s warm-up, 0.5 s tail (a smoke test,
seconds per broker). Every wait is bounded: a broker that fails or a worker that hangs gives
an error column, not a hang. The exit status is 0 unless a broker's run failed to complete.
Everything shares the machine; on 2 cores the Python clients compete with the broker for
CPU, the same for every broker (the load average is printed).
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
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

from bench import workload  # noqa: E402
from bench.harness import BenchError, peers  # noqa: E402
from bench.harness.clients.shell import ConnectionLost, LeanClient  # noqa: E402
from bench.harness.crossload import (  # noqa: E402
    CONNECT_TIMEOUT,
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
from bench.harness.procfs import cpu_seconds, proc_status  # noqa: E402
from bench.harness.report import (  # noqa: E402
    Goals,
    arg_parser,
    fmt,
    print_ending,
    write_report,
)
from bench.harness.report import machine_info as common_machine_info  # noqa: E402
from bench.harness.workers import Worker  # noqa: E402
from routing import SubscriptionTable  # noqa: E402

PAYLOAD_SIZE = 256
TOPIC_COUNT = 100_000
WORKER_READY_TIMEOUT = 120.0
BEHIND_MS = 20.0  # a batch later than this behind its schedule: the publisher fell behind
GOAL_STORM_P99_MS = 10.0
GOAL_VS_MOSQUITTO = 1.5
GOAL_OUTSIDE_P99_MS = 1.0
GOAL_STORM_SECONDS = 1.0
GOAL_STORM_FILTERS = 50_000
GOAL_RATE = 20_000

FULL: dict[str, Any] = {
    "rate": GOAL_RATE,
    "storm_filters": GOAL_STORM_FILTERS,
    "bystander_filters": 1_000,
    "bystander_connections": 4,
    "bystander_processes": 2,
    "warmup_seconds": 3.0,
    "settle_seconds": 0.5,  # the start of the warm-up, not measured
    "tail_seconds": 2.0,
    "storm_timeout": 120.0,
    "drain_timeout": 30.0,
}
QUICK: dict[str, Any] = {
    **FULL,
    "rate": 5_000,
    "storm_filters": 5_000,
    "warmup_seconds": 1.0,
    "settle_seconds": 0.25,
    "tail_seconds": 0.5,
    "storm_timeout": 30.0,
    "drain_timeout": 15.0,
}
PHASES = ("outside", "storm", "after")


# -- the storm connection (a worker process) --------------------------------------------------


async def storm_main(pipe: Pipe, protocol: str, port: int, filters: list[str], name: str) -> None:
    """Worker: one connection, always read (messages counted); on ``("storm", timeout)``
    subscribe every filter, then unsubscribe them all; report the two timings."""
    with trio.fail_after(CONNECT_TIMEOUT):
        client = await LeanClient.connect(protocol, port, name)
    received = 0

    def count(_: int, messages: list) -> None:
        nonlocal received
        received += len(messages)

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.read_forever, count)
            pipe.send(("ready", {"pid": os.getpid()}))
            while True:
                command = await trio.to_thread.run_sync(pipe.recv)
                if command[0] == "stop":
                    break
                _, timeout = command
                info: dict[str, Any] = {"count": len(filters)}
                cpu = time.process_time()
                try:
                    with trio.fail_after(timeout):
                        sub = await client.subscribe(filters)
                        info["subscribe"] = _timing(sub)
                        info["received_while_subscribed"] = received
                        unsub = await client.unsubscribe_all()
                        info["unsubscribe"] = _timing(unsub)
                except trio.TooSlowError:
                    info["error"] = f"the storm did not finish within {timeout:g} s"
                except ConnectionLost as exc:
                    info["error"] = f"storm connection lost: {exc}"
                info["received"] = received
                info["stray_messages"] = client.stray_messages
                info["cpu_seconds"] = time.process_time() - cpu
                pipe.send(("stormed", info))
            nursery.cancel_scope.cancel()
    finally:
        await client.aclose()


def _timing(timing: Any) -> dict[str, Any]:
    return {
        "count": timing.count,
        "seconds": timing.seconds,
        "first_ns": timing.first_ns,
        "last_ns": timing.last_ns,
        "refused": timing.refused,
    }


# -- filters -----------------------------------------------------------------------------------


def storm_filters(count: int, seed: int, hits: bool) -> tuple[list[str], dict[str, int]]:
    """``count`` distinct portable filters for the storm connection; with ``hits`` on the
    traffic's sites, else on sites it never names (index >= workload.N_SITES)."""
    if hits:
        return portable_subscriptions(count, seed, broad=False, prefix="storm")
    n_sites = workload.N_SITES + 4 * count  # most tenants land on appended sites
    want = count
    while True:
        filters, counts = portable_subscriptions(
            want, seed, broad=False, prefix="storm", n_sites=n_sites
        )
        outside = [f for f in filters if int(f.split("/")[3][1:]) >= workload.N_SITES]
        if len(outside) >= count:
            counts = {**counts, "on_traffic_sites": len(filters) - len(outside)}
            return outside[:count], counts
        want += count - len(outside) + count // 8


def matching_topics(filters: list[str], topics: list[str]) -> int:
    """How many distinct topics of ``topics`` any of ``filters`` matches."""
    table = SubscriptionTable(cache_size=0)
    for index, text in enumerate(filters):
        table.add(text, index)
    return sum(1 for topic in set(topics) if table.match_uncached(topic))


# -- one broker --------------------------------------------------------------------------------


def _arrays(result: dict[str, Any]) -> tuple[array, array, array]:
    out = []
    for key in ("indices", "sent_ns", "read_ns"):
        values = array("q")
        values.frombytes(result[key])
        out.append(values)
    return out[0], out[1], out[2]


def _latencies(
    conns: list[dict[str, Any]], published: dict[str, Any], windows: dict[str, tuple[int, int]]
) -> dict[str, Any]:
    """Latency per phase, from the publish timestamp and from the schedule."""
    start_ns, rate, offset = published["start_ns"], published["rate"], published["offset"]
    per_ns = 1e9 / rate
    send: dict[str, list[int]] = {phase: [] for phase in windows}
    schedule: dict[str, list[int]] = {phase: [] for phase in windows}
    bounds = list(windows.items())
    for conn in conns:
        indices, sent_ns, read_ns = _arrays(conn)
        for index, sent, read in zip(indices, sent_ns, read_ns, strict=True):
            due = start_ns + int((index - offset) * per_ns)
            for phase, (low, high) in bounds:
                if low <= due < high:
                    send[phase].append(read - sent)
                    schedule[phase].append(read - due)
                    break
    return {
        phase: {"send": latency_summary(send[phase]), "schedule": latency_summary(schedule[phase])}
        for phase in windows
    }


def _exactness(
    conns: list[dict[str, Any]], expectation: Expectation, published: dict[str, Any]
) -> dict[str, Any]:
    rows = []
    for k, conn in enumerate(conns):
        indices, _, _ = _arrays(conn)
        row = expectation.check(k, indices, published["sent"], published["offset"])
        row["error"] = conn["error"]
        row["late"] = conn["late"]
        row["malformed"] = conn["malformed"]
        rows.append(row)
    totals = {
        key: sum(r[key] for r in rows)
        for key in ("expected", "received", "missing", "duplicates", "unexpected")
    }
    exact = (
        all(r["error"] is None for r in rows)
        and totals["missing"] == totals["duplicates"] == totals["unexpected"] == 0
    )
    return {"exact": exact, **totals, "connections": rows}


def _topiary_stats(port: int) -> dict[str, Any] | None:
    try:
        return broker_stats(port)
    except Exception as exc:  # a broker that no longer answers: recorded, not fatal
        return {"error": f"{type(exc).__name__}: {exc}"}


def _stats_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any]:
    if not before or not after or "error" in before or "error" in after:
        return {"error": (after or {}).get("error") or (before or {}).get("error")}
    keys = ("messages_in", "messages_out", "dropped", "slow_consumer_disconnects")
    out: dict[str, Any] = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}
    out["subscribes"] = int(after.get("subscribes", 0)) - int(before.get("subscribes", 0))
    out["unsubscribes"] = int(after.get("unsubscribes", 0)) - int(before.get("unsubscribes", 0))
    out["table_entries_before"] = before.get("table", {}).get("entries")
    out["table_entries_after"] = after.get("table", {}).get("entries")
    return out


def run_kind(
    kind: str,
    params: dict[str, Any],
    plan: dict[str, Any],
    seed: int,
    ctx: Any,
    log_dir: Path,
) -> dict[str, Any]:
    """One broker of ``kind``: start it, run the timeline, stop it; never raises for what
    the broker or a worker did (``error`` in the result)."""
    result: dict[str, Any] = {"kind": kind, "installed": peers.installed(kind)}
    if not result["installed"]:
        return result
    result["version"] = peers.version(kind)
    result["load_average_start"] = os.getloadavg()  # brokers run one after the other
    result["protocol"] = peers.PROTOCOL[kind]
    result["delivery"] = peers.DELIVERY[kind]
    broker: peers.RunningBroker | None = None
    workers: list[Worker] = []
    started = time.monotonic()
    protocol = peers.PROTOCOL[kind]
    rate = params["rate"]
    try:
        broker = peers.start(kind, log_dir, f"storm-{kind}")
        result["broker_pid"] = broker.pid
        result["broker_log"] = str(broker.log_path)
        subs = [
            Worker(ctx, subscriber_main, (protocol, broker.port, conns, f"by{i}"), f"{kind}-by{i}")
            for i, conns in enumerate(plan["processes"])
        ]
        workers.extend(subs)
        pub = Worker(
            ctx,
            publisher_main,
            (protocol, broker.port, TOPIC_COUNT, seed, (PAYLOAD_SIZE, PAYLOAD_SIZE), "pub"),
            f"{kind}-pub",
        )
        storm = Worker(
            ctx, storm_main, (protocol, broker.port, plan["storm"], "storm"), f"{kind}-storm"
        )
        workers.extend([pub, storm])
        result["worker_pids"] = [w.pid for w in workers]
        ready = [w.expect("ready", WORKER_READY_TIMEOUT)[1] for w in workers]
        refused = sum(sum(r["refused"]) for r in ready[: len(subs)])
        if refused:
            first = next(r["first_refusal"] for r in ready if r.get("first_refusal"))
            raise BenchError(f"{refused} bystander filters refused, first: {first}")
        result["bystanders_subscribed"] = sum(sum(r["subscribed"]) for r in ready[: len(subs)])
        result["setup_seconds"] = time.monotonic() - started

        stats_before = _topiary_stats(broker.port) if kind == "topiary" else None
        cpu_before = cpu_seconds(broker.pid)
        run_seconds = params["warmup_seconds"] + params["storm_timeout"] + params["tail_seconds"]
        count_timeout = run_seconds + params["drain_timeout"] + 10
        for worker in subs:
            worker.send(("count", "storm", count_timeout, True))
        for worker in subs:
            worker.expect("armed", 30)
        pub.send(("paced", "storm", 0, rate, run_seconds + 5, int(rate * (run_seconds + 5))))
        time.sleep(params["warmup_seconds"])  # the schedule, not a synchronisation
        storm.send(("storm", params["storm_timeout"]))
        stormed = storm.expect("stormed", params["storm_timeout"] + 30)[1]
        result["storm"] = stormed
        time.sleep(params["tail_seconds"])
        pub.send(("halt",))
        published = pub.expect("published", 60)[1]
        conns: list[dict[str, Any]] = []
        sub_cpu = 0.0
        for worker in subs:
            _, rows, cpu = worker.expect("result", count_timeout + 30)
            conns.extend(rows)
            sub_cpu += cpu
        pub.send(("enough",))
        result["markers_published"] = pub.expect("stopped", 30)[1]["markers"]
        result["broker_cpu_seconds"] = cpu_seconds(broker.pid) - cpu_before
        status = proc_status(broker.pid)
        result["broker_peak_rss_mb"] = status.get("VmHWM")
        result["broker_rss_mb"] = status.get("VmRSS")
        if kind == "topiary":
            result["broker_stats"] = _stats_delta(stats_before, _topiary_stats(broker.port))

        late = published.pop("late_batches")
        long_writes = published.pop("long_writes")
        result["publisher"] = {
            **published,
            "long_writes_first": long_writes[:20],
            "long_write_count": len(long_writes),
            "behind": (published["lag_ms"]["max"] or 0) > BEHIND_MS,
            "late_batches_first": late[:20],
            "late_batch_count": len(late),
            "subscriber_cpu_seconds": sub_cpu,
        }
        first_ns = published["start_ns"]
        if "subscribe" in stormed and "unsubscribe" in stormed:
            storm_start = stormed["subscribe"]["first_ns"]
            storm_end = stormed["unsubscribe"]["last_ns"]
        else:  # the storm did not finish: everything after its start is "storm"
            storm_start = first_ns + int(params["warmup_seconds"] * 1e9)
            storm_end = 2**62
        windows = {
            "outside": (first_ns + int(params["settle_seconds"] * 1e9), storm_start),
            "storm": (storm_start, storm_end + 1),
            "after": (storm_end + 1, 2**62),
        }
        result["windows_seconds"] = {
            phase: [
                round((low - first_ns) / 1e9, 3),
                round((min(high, published["last_ns"]) - first_ns) / 1e9, 3),
            ]
            for phase, (low, high) in windows.items()
        }
        result["latency_ms"] = _latencies(conns, published, windows)
        result["exactness"] = _exactness(conns, plan["expectations"][kind], published)
        result["bystander_errors"] = [c["error"] for c in conns if c["error"]]
        if "error" in stormed:
            result["error"] = stormed["error"]
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


# -- the plan (what every broker runs) --------------------------------------------------------


def make_plan(params: dict[str, Any], seed: int, kinds: list[str], hits: bool) -> dict[str, Any]:
    filters, drawn = portable_subscriptions(params["bystander_filters"], seed)
    conns = split(filters, params["bystander_connections"])
    processes = split(conns, params["bystander_processes"])
    # Worker k::P holds connections k, k+P, ...: the result rows come back in that order.
    ordered = [conn for process in processes for conn in process]
    topics = publisher_topics(TOPIC_COUNT, seed)
    storm, storm_drawn = storm_filters(params["storm_filters"], seed, hits)
    deliveries = {peers.DELIVERY[kind] for kind in kinds if peers.installed(kind)}
    built = Expectation.build(ordered, topics, sorted(deliveries))
    expectations = {kind: built[peers.DELIVERY[kind]] for kind in kinds if peers.installed(kind)}
    return {
        "processes": processes,
        "storm": storm,
        "expectations": expectations,
        "bystander_filters": {**drawn, "kept": len(filters)},
        "storm_filters": {**storm_drawn, "kept": len(storm), "hits": hits},
        "storm_matching_topics": matching_topics(storm, topics),
        "distinct_topics": len(set(topics)),
    }


# -- report ------------------------------------------------------------------------------------


def _lat(result: dict[str, Any], phase: str, basis: str = "send") -> dict[str, Any]:
    return (result.get("latency_ms", {}).get(phase) or {}).get(basis) or {}


def _ms(value: float) -> str:
    """Milliseconds with the digits that matter: 0.42, 12.3, 1,128."""
    if value < 10:
        return f"{value:.2f}"
    if value < 100:
        return f"{value:.1f}"
    return f"{value:,.0f}"


def _triple(lat: dict[str, Any]) -> str:
    if not lat:
        return "-"
    return f"{_ms(lat['p50'])} / {_ms(lat['p99'])} / {_ms(lat['max'])}"


def table_lines(report: dict[str, Any]) -> list[str]:
    kinds = list(report["brokers"])
    results = report["brokers"]
    params = report["parameters"]
    width = 26
    head = f"{'':<38}" + "".join(f"{k:>{width}}" for k in kinds) + f"  {'goal (topiary)'}"
    lines = [
        f"storm of {params['storm_filters']:,} filters under {params['rate']:,} msg/s, "
        f"{report['plan']['bystander_filters']['kept']:,} bystander filters on "
        f"{params['bystander_connections']} connections",
        head,
        "-" * len(head),
    ]

    def row(label: str, cell: Any, goal: str = "") -> None:
        cells = []
        for kind in kinds:
            r = results[kind]
            if not r["installed"]:
                text = "not installed"
            elif "latency_ms" not in r and "storm" not in r:
                text = "failed"
            else:
                try:
                    text = cell(r)
                except (KeyError, TypeError):
                    text = "-"
            cells.append(f"{text:>{width}}")
        lines.append(f"{label:<38}" + "".join(cells) + (f"  {goal}" if goal else ""))

    def seconds(key: str) -> Any:
        return lambda r: fmt(r["storm"].get(key, {}).get("seconds"), ".3f")

    row("storm subscribe s", seconds("subscribe"), f"<= {GOAL_STORM_SECONDS:g}")
    row("storm unsubscribe s", seconds("unsubscribe"), f"<= {GOAL_STORM_SECONDS:g}")
    row("during storm p50 / p99 / max ms", lambda r: _triple(_lat(r, "storm")))
    row(
        "  from schedule p50 / p99 / max ms",
        lambda r: _triple(_lat(r, "storm", "schedule")),
        f"p99 <= {GOAL_STORM_P99_MS:g}, <= {GOAL_VS_MOSQUITTO:g}x mosquitto",
    )
    row(
        "outside storm p50 / p99 / max ms",
        lambda r: _triple(_lat(r, "outside")),
        f"p99 <= {GOAL_OUTSIDE_P99_MS:g}",
    )
    row("  from schedule p50 / p99 / max ms", lambda r: _triple(_lat(r, "outside", "schedule")))
    row("after storm p50 / p99 / max ms", lambda r: _triple(_lat(r, "after")))
    row(
        "samples outside / storm / after",
        lambda r: " / ".join(
            f"{(_lat(r, phase).get('samples') or 0) / 1000:,.1f}k"
            for phase in ("outside", "storm", "after")
        ),
    )
    row(
        "publisher msg/s (max lag ms)",
        lambda r: (
            f"{r['publisher']['achieved_rate']:,.0f} ({r['publisher']['lag_ms']['max']:.1f})"
            + (" BEHIND" if r["publisher"]["behind"] else "")
        ),
    )
    row(
        "publisher blocked writing: max / total ms",
        lambda r: (
            f"{_ms(r['publisher']['blocked_ms']['max'])} / "
            f"{_ms(r['publisher']['blocked_ms']['total'])}"
        ),
    )
    row("bystander deliveries", lambda r: f"{r['exactness']['received']:,}")
    row("exact (missing/dup/unexpected)", _exact_cell, "exact")
    row("broker peak RSS MB", lambda r: fmt(r.get("broker_peak_rss_mb"), ",.1f"))
    row("broker CPU s", lambda r: fmt(r.get("broker_cpu_seconds"), ".1f"))
    row(
        "client CPU s: storm / bystanders / pub",
        lambda r: (
            f"{r['storm']['cpu_seconds']:.1f} / "
            f"{r['publisher']['subscriber_cpu_seconds']:.1f} / {r['publisher']['cpu_seconds']:.1f}"
        ),
    )
    row("machine load average at start", lambda r: f"{r['load_average_start'][0]:.2f}")
    for kind in kinds:
        r = results[kind]
        if r["installed"] and "error" in r:
            lines.append(f"{kind}: FAILED: {brief(r['error'], 160)}")
    missing = [k for k in kinds if not results[k]["installed"]]
    if missing:
        lines.append(f"not installed: {', '.join(missing)} ({peers.INSTALL_HINT})")
    return lines


def _exact_cell(r: dict[str, Any]) -> str:
    e = r["exactness"]
    if e["exact"]:
        return "yes"
    return f"NO {e['missing']:,}/{e['duplicates']:,}/{e['unexpected']:,}"


def check_goals(report: dict[str, Any]) -> Goals:
    params = report["parameters"]
    ours = report["brokers"].get("topiary", {})
    goals = Goals()
    comparable = (
        params["storm_filters"] == GOAL_STORM_FILTERS
        and params["rate"] == GOAL_RATE
        and not params["quick"]
    )
    # During the storm, from the schedule: a broker that stops reading its publishers
    # delays their messages too, which the publish stamp cannot show (the ~1 ms of timer
    # slack it adds is small beside 10 ms). Outside it, from the publish stamp: there the
    # slack would be as large as the goal (the publisher's lag is reported beside it).
    storm_p99 = _lat(ours, "storm", "schedule").get("p99")
    stamped_p99 = _lat(ours, "storm").get("p99")
    outside_p99 = _lat(ours, "outside").get("p99")
    judge = comparable or None  # quick or different settings: reported, not judged

    def met(value: Any, ok: bool) -> bool | None:
        return None if value is None or judge is None else ok

    goals.add(
        f"bystanders' p99 during the storm (from schedule) <= {GOAL_STORM_P99_MS:g} ms",
        storm_p99,
        met(storm_p99, storm_p99 is not None and storm_p99 <= GOAL_STORM_P99_MS),
    )
    mosquitto = report["brokers"].get("mosquitto", {})
    theirs = _lat(mosquitto, "storm", "schedule").get("p99")
    ratio = storm_p99 / theirs if storm_p99 is not None and theirs else None
    goals.add(
        f"bystanders' p99 during the storm (from schedule) <= {GOAL_VS_MOSQUITTO:g}x "
        "Mosquitto's (same run)",
        ratio,
        met(ratio, ratio is not None and ratio <= GOAL_VS_MOSQUITTO),
    )
    goals.add(
        f"bystanders' p99 outside the storm <= {GOAL_OUTSIDE_P99_MS:g} ms",
        outside_p99,
        met(outside_p99, outside_p99 is not None and outside_p99 <= GOAL_OUTSIDE_P99_MS),
    )
    for key in ("subscribe", "unsubscribe"):
        seconds = ours.get("storm", {}).get(key, {}).get("seconds")
        goals.add(
            f"storm {key} of {GOAL_STORM_FILTERS:,} filters <= {GOAL_STORM_SECONDS:g} s",
            seconds,
            met(seconds, seconds is not None and seconds <= GOAL_STORM_SECONDS),
        )
    exact = ours.get("exactness", {}).get("exact")
    goals.add("every bystander delivery exact", exact, exact)
    if stamped_p99 is not None:
        goals[0]["note"] = f"from the publish stamp: {stamped_p99:,.3f} ms"
    if not comparable:
        for goal in goals[:-1]:
            goal["note"] = (
                f"judged only at {GOAL_STORM_FILTERS:,} filters and {GOAL_RATE:,} msg/s, "
                "not in a quick run"
            )
    return goals


def notes(report: dict[str, Any]) -> list[str]:
    out: list[str] = []
    plan = report["plan"]
    if plan["storm_matching_topics"] and not plan["storm_filters"]["hits"]:
        out.append(
            f"storm filters match {plan['storm_matching_topics']} published topics "
            "(they should match none)"
        )
    for kind, r in report["brokers"].items():
        if not r["installed"]:
            out.append(f"{kind}: not installed ({peers.INSTALL_HINT}); skipped")
            continue
        if "error" in r:
            out.append(f"{kind}: FAILED: {brief(r['error'])}")
        storm = r.get("storm", {})
        for key in ("subscribe", "unsubscribe"):
            refused = storm.get(key, {}).get("refused")
            if refused:
                out.append(f"{kind}: {refused:,} storm {key}s refused")
        if storm.get("received") and not plan["storm_filters"]["hits"]:
            out.append(f"{kind}: the storm connection received {storm['received']:,} messages")
        pub = r.get("publisher")
        if pub and pub["behind"]:
            out.append(
                f"{kind}: the publisher fell behind its schedule: {pub['late_batch_count']:,} "
                f"batches more than 5 ms late, worst {pub['lag_ms']['max']:.1f} ms (first at "
                f"{pub['late_batches_first'][0][0] if pub['late_batches_first'] else '?'} s)"
            )
        exact = r.get("exactness")
        if exact and not exact["exact"]:
            out.append(
                f"{kind}: bystanders got {exact['received']:,} of {exact['expected']:,} "
                f"copies owed: {exact['missing']:,} missing, {exact['duplicates']:,} "
                f"duplicated, {exact['unexpected']:,} unexpected"
            )
        for error in r.get("bystander_errors", [])[:3]:
            out.append(f"{kind}: bystander: {error}")
        stats = r.get("broker_stats") or {}
        if stats.get("dropped"):
            out.append(f"{kind}: the broker dropped {stats['dropped']:,} messages")
        if stats.get("slow_consumer_disconnects"):
            out.append(f"{kind}: {stats['slow_consumer_disconnects']} slow-consumer disconnects")
        if stats.get("table_entries_after") != stats.get("table_entries_before"):
            out.append(
                f"{kind}: table entries {stats.get('table_entries_before')} before the storm, "
                f"{stats.get('table_entries_after')} after"
            )
        summary = r.get("broker_log_summary", {})
        if summary.get("problem_count"):
            out.append(
                f"{kind}: broker log has {summary['problem_count']} problem lines, first: "
                f"{summary['problems'][0][:200]}"
            )
        stop = r.get("broker_stop", {})
        expected_status = (0, 1) if kind == "nats" else (0,)  # nats-server exits 1 on SIGTERM
        if stop.get("killed") or stop.get("exit_status") not in (*expected_status, None):
            out.append(f"{kind}: broker stop: {stop}")
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(
        __doc__, quick="5,000 storm filters at 5,000 msg/s, short phases (a smoke test)"
    )
    parser.add_argument("--rate", type=int, help="publisher msg/s (default 20,000)")
    parser.add_argument("--storm-filters", type=int, help="filters in the storm (default 50,000)")
    parser.add_argument(
        "--storm-hits",
        action="store_true",
        help="storm filters on the traffic's own sites (default: on sites it never names)",
    )
    parser.add_argument(
        "--brokers",
        default=",".join(peers.KINDS),
        help="comma-separated broker kinds (default: %(default)s; missing ones are reported "
        "as not installed; relay-trio and relay-epoll: the reference relays)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument("--log-dir", help="keep the brokers' logs here (default: removed)")
    args = parser.parse_args(argv)
    kinds = [k.strip() for k in args.brokers.split(",") if k.strip()]
    known = (*peers.KINDS, *peers.RELAY_KINDS)  # the relays: the floor of a Python process
    unknown = sorted(set(kinds) - set(known))
    if unknown or not kinds:
        parser.error(f"unknown brokers {unknown}; known: {', '.join(known)}")
    args.kinds = [k for k in known if k in kinds]
    for name in ("rate", "storm_filters"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def _goal_value(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value) if value is not None else "-"
    return f"{value:,.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    if args.rate is not None:
        params["rate"] = args.rate
    if args.storm_filters is not None:
        params["storm_filters"] = args.storm_filters
    ctx = multiprocessing.get_context("spawn")
    report: dict[str, Any] = {
        "benchmark": "storm",
        "machine": common_machine_info(
            trio=trio.__version__, **{k: peers.version(k) for k in args.kinds}
        ),
        "parameters": {
            **params,
            "quick": args.quick,
            "seed": args.seed,
            "brokers": args.kinds,
            "payload_size": PAYLOAD_SIZE,
            "topic_count": TOPIC_COUNT,
            "storm_hits": args.storm_hits,
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "brokers": {},
    }
    started = time.monotonic()
    print(
        f"storm: {report['machine']['cpu_count']} CPUs, Python {report['machine']['python']}, "
        f"load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    plan = make_plan(params, args.seed, args.kinds, args.storm_hits)
    report["plan"] = {
        k: v for k, v in plan.items() if k not in ("processes", "storm", "expectations")
    }
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix="topiary-storm-")
    log_dir = Path(args.log_dir or temp_dir)  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    try:
        for kind in args.kinds:
            if not peers.installed(kind):
                print(f"  {kind}: not installed ({peers.INSTALL_HINT})", flush=True)
                report["brokers"][kind] = {"kind": kind, "installed": False}
                continue
            print(f"  running {kind} ...", flush=True)
            result = run_kind(kind, params, plan, args.seed, ctx, log_dir)
            if "error" in result:
                failed = True
                print(f"  {kind} failed: {result['error']}", file=sys.stderr, flush=True)
            report["brokers"][kind] = result
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = time.monotonic() - started
    report["goals"] = check_goals(report)
    report["notes"] = notes(report)
    print()
    for line in table_lines(report):
        print(line)
    print()
    b = report["plan"]["bystander_filters"]
    s = report["plan"]["storm_filters"]
    print(
        f"bystander filters: the first {b['kept']:,} portable of {b['drawn']:,} workload "
        f"entries drawn ({b['dropped']:,} prefix wildcards skipped, {b['mapped']:,} MQTT-dialect "
        f"mapped); storm filters: {s['kept']:,} "
        + (
            "on the traffic's sites"
            if s["hits"]
            else f"on sites the traffic never names ({report['plan']['storm_matching_topics']} "
            f"of {report['plan']['distinct_topics']:,} published topics matched)"
        )
        + f"; payload {PAYLOAD_SIZE} B; latency by the message's due time; 'from schedule' = "
        "read time - due time (includes the publisher's ~1 ms timer slack and any hold-up)"
    )
    print_ending(report, _goal_value)
    write_report(report, args.json, sort_keys=False)  # the brokers in their order
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
