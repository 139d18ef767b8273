"""Broker memory: what an idle connection and a filter cost, read from /proc.

    python bench/memory.py [--quick] [--json PATH] [--only NAMES] [--connections N]
                           [--filters F] [--spread C] [--seed N] [--log-dir DIR]

Every scenario starts a fresh broker (``python -m broker.cli serve``, bench/harness/
processes.py) and measures its resident set (VmRSS in /proc/PID/status) before and after
one worker process (spawn context) opens native connections to it and, for some
scenarios, subscribes:

- ``idle``            N connections (2,000; ``--quick`` 200) that complete HELLO/WELCOME:
                      transient sessions, no subscriptions. Bytes per connection.
- ``idle-sub``        the same with one subscription each (N distinct workload filters,
                      one per connection). Bytes per connection; minus ``idle``'s figure,
                      what that one subscription costs.
- ``filters-1``       one connection subscribes F distinct workload filters (50,000;
                      ``--quick`` 5,000), pipelined as one buffer. Bytes per filter.
- ``filters-spread``  the same F filters over C connections (1,000; ``--quick`` 100;
                      connection k holds filters ``k::C``). Bytes per filter, raw and
                      net of C idle connections at ``idle``'s per-connection figure.

Filters are ``bench.e2e.subscribe_filters`` (``workload.subscriptions`` deduplicated, each
with its dialect). The worker speaks the protocol with the raw clients of
bench/harness/wire.py (HELLO asking for a 600 s keepalive, so the broker sends no PINGs
while they sit idle), at most ``CONNECT_CONCURRENCY`` handshakes at a time.

Before the measured connections, a warm-up (``WARMUP_CONNECTIONS`` connections with
``WARMUP_FILTERS`` filters each, then closed) runs every code path once, so the "before"
reading already holds what the first connection of a broker's life costs once (lazily
built caches, imports, allocator pools). The barrier before each reading is the broker's
``stats`` (asked on a connection of its own, which is open while it answers: the figure
checks that the broker holds every measured connection, and the table every filter);
then VmRSS is read every ``SETTLE_INTERVAL`` s until two readings in a row differ by at
most ``SETTLE_TOLERANCE_KIB`` (at most ``SETTLE_READINGS`` readings), and the last one
counts. Per item = (after - before) / items. RSS counts what the allocator holds, not
what live objects need: transient garbage that left a pool half full (the 50,000 SUB
frames of one pipelined read, say) is part of the figure, as it is for an operator.
Socket buffers are kernel memory and not in RSS.

File descriptors: the broker and the worker each hold one per connection. Both raise
their soft RLIMIT_NOFILE (up to the hard limit) to what the run needs, the broker by
inheriting the coordinator's; the limits are in the JSON, and a hard limit too low for
the run is an error before anything starts.

Mosquitto and nats-server (when installed) are not measured here: that needs their
protocols' clients, which bench/harness/peers.py is getting (branch storm-bench); the
table says whether each is installed.

Goals of issue 18 (informational): <= 10 KiB per idle connection, <= 1 KiB per filter
at 50,000 filters. The exit status is 0 unless a scenario failed to run.
"""

from __future__ import annotations

import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import trio  # noqa: E402

from bench.e2e import subscribe_filters  # noqa: E402
from bench.harness import BenchError  # noqa: E402
from bench.harness.logs import scan_log  # noqa: E402
from bench.harness.processes import (  # noqa: E402
    BrokerProcess,
    broker_stats,
    start_broker,
    stop_broker,
)
from bench.harness.procfs import proc_status  # noqa: E402
from bench.harness.report import (  # noqa: E402
    Goals,
    arg_parser,
    print_ending,
    write_report,
)
from bench.harness.report import machine_info as common_machine_info  # noqa: E402
from bench.harness.wire import open_raw, pipelined  # noqa: E402
from bench.harness.workers import Worker  # noqa: E402
from broker.wire.frames import Sub, SubAck  # noqa: E402

IDLE = "idle"
IDLE_SUB = "idle-sub"
FILTERS_ONE = "filters-1"
FILTERS_SPREAD = "filters-spread"
ALL_SCENARIOS = (IDLE, IDLE_SUB, FILTERS_ONE, FILTERS_SPREAD)

FULL: dict[str, int] = {"connections": 2_000, "filters": 50_000, "spread": 1_000}
QUICK: dict[str, int] = {"connections": 200, "filters": 5_000, "spread": 100}

GOAL_CONNECTION_BYTES = 10 * 1024
GOAL_FILTER_BYTES = 1024
GOAL_FILTER_COUNT = 50_000

CONNECT_CONCURRENCY = 64  # handshakes in flight at once in the worker
WORKER_TIMEOUT = 300.0  # to open and subscribe everything
WARMUP_CONNECTIONS = 20
WARMUP_FILTERS = 5
FD_MARGIN = 64  # descriptors beyond one per connection (listeners, store, stats, pipes)
SETTLE_INTERVAL = 0.25
SETTLE_READINGS = 12
SETTLE_TOLERANCE_KIB = 64
DRAIN_TIMEOUT = 30.0  # for the warm-up's connections to be gone

PEERS = {"mosquitto": "/usr/sbin/mosquitto", "nats-server": "/usr/sbin/nats-server"}


# -- file descriptors ---------------------------------------------------------------------


def raise_nofile(needed: int) -> dict[str, int]:
    """Raise this process's soft RLIMIT_NOFILE to ``needed`` if it is lower (never above the
    hard limit); the limits after. BenchError when the hard limit is too low."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        if hard != resource.RLIM_INFINITY and hard < needed:
            raise BenchError(
                f"{needed} file descriptors needed, the hard limit is {hard} (ulimit -Hn)"
            )
        resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
        soft = needed
    return {"soft": soft, "hard": hard, "needed": needed}


# -- the worker: holds the connections ----------------------------------------------------


async def holder_main(pipe: Pipe, port: int, plan: list[list[tuple[str, str]]]) -> None:
    """Open one connection per entry of ``plan``, subscribe its filters (pipelined), report
    "ready" and hold them all idle until told to stop."""
    nofile = raise_nofile(len(plan) + FD_MARGIN)
    streams: list[trio.SocketStream] = []
    subacks = 0
    errors: list[str] = []
    limiter = trio.CapacityLimiter(CONNECT_CONCURRENCY)

    async def open_one(filters: list[tuple[str, str]]) -> None:
        nonlocal subacks
        async with limiter:
            stream, proto = await open_raw(port)
            streams.append(stream)
            if filters:
                frames = [Sub(id=i, filter=f, dialect=d) for i, (f, d) in enumerate(filters, 1)]
                _seconds, acks, refused = await pipelined(
                    stream, proto, proto.send_many(frames), SubAck, len(frames)
                )
                subacks += len(acks)
                errors.extend(f"{e.code}: {e.text}" for e in refused[:3])

    started = time.monotonic()
    try:
        with trio.fail_after(WORKER_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for filters in plan:
                    nursery.start_soon(open_one, filters)
        pipe.send(
            (
                "ready",
                {
                    "welcomed": len(streams),
                    "subacks": subacks,
                    "errors": errors[:10],
                    "setup_seconds": round(time.monotonic() - started, 3),
                    "nofile": nofile,
                    "pid": os.getpid(),
                },
            )
        )
        await trio.to_thread.run_sync(pipe.recv)  # ("stop",)
    finally:
        for stream in streams:
            await trio.aclose_forcefully(stream)


# -- the coordinator ----------------------------------------------------------------------


def settled_rss(broker: BrokerProcess, expect_connections: int) -> dict[str, Any]:
    """The barrier (the broker's ``stats``), then VmRSS until it settles: the last reading
    (KiB), every reading, and the stats."""
    stats = broker_stats(broker.port)
    if stats.get("connections") != expect_connections:
        raise BenchError(
            f"the broker holds {stats.get('connections')} connections, "
            f"expected {expect_connections} (the stats connection included)"
        )
    readings: list[int] = []
    while len(readings) < SETTLE_READINGS:
        readings.append(round(proc_status(broker.pid)["VmRSS"] * 1024))
        if len(readings) >= 2 and abs(readings[-1] - readings[-2]) <= SETTLE_TOLERANCE_KIB:
            break
        time.sleep(SETTLE_INTERVAL)
    return {"rss_kib": readings[-1], "readings_kib": readings, "stats": stats}


def wait_connections(port: int, count: int, timeout: float = DRAIN_TIMEOUT) -> None:
    """Wait until the broker holds ``count`` connections (the one asking included)."""
    deadline = time.monotonic() + timeout
    while broker_stats(port).get("connections") != count:
        if time.monotonic() > deadline:
            raise BenchError(f"the broker did not get down to {count} connections")
        time.sleep(0.05)


def _table(stats: dict[str, Any]) -> dict[str, Any]:
    table = stats.get("table", {})
    return {k: table.get(k) for k in ("entries", "filters", "trie_nodes")}


def run_scenario(
    name: str, plan: list[list[tuple[str, str]]], ctx: Any, log_dir: Path
) -> dict[str, Any]:
    """One scenario on a fresh broker: warm up, read, open ``plan``'s connections, read."""
    connections = len(plan)
    filters = sum(len(f) for f in plan)
    result: dict[str, Any] = {"name": name, "connections": connections, "filters": filters}
    broker: BrokerProcess | None = None
    worker: Worker | None = None
    started = time.monotonic()
    try:
        broker = start_broker(log_dir / f"{name}.log")
        result["broker_pid"] = broker.pid
        warmup = [
            [(f"warmup/{i}/{j}/>", "native") for j in range(WARMUP_FILTERS)]
            for i in range(WARMUP_CONNECTIONS)
        ]
        worker = Worker(ctx, holder_main, (broker.port, warmup), f"{name}-warmup")
        worker.expect("ready", WORKER_TIMEOUT)
        worker.stop()
        worker = None
        wait_connections(broker.port, 1)
        before = settled_rss(broker, 1)
        worker = Worker(ctx, holder_main, (broker.port, plan), name)
        ready = worker.expect("ready", WORKER_TIMEOUT + 10)[1]
        result.update({k: ready[k] for k in ("welcomed", "subacks", "errors", "setup_seconds")})
        result["worker_nofile"] = ready["nofile"]
        after = settled_rss(broker, connections + 1)
        delta = after["rss_kib"] - before["rss_kib"]
        hwm = proc_status(broker.pid)["VmHWM"]
        result.update(
            {
                "rss_before_kib": before["rss_kib"],
                "rss_after_kib": after["rss_kib"],
                "readings_before_kib": before["readings_kib"],
                "readings_after_kib": after["readings_kib"],
                "rss_delta_kib": delta,
                "hwm_kib": round(hwm * 1024),
                "table_before": _table(before["stats"]),
                "table_after": _table(after["stats"]),
                "subscriptions": after["stats"].get("subscriptions"),
                "per_connection_bytes": round(delta * 1024 / connections) if connections else None,
                "per_filter_bytes": round(delta * 1024 / filters) if filters else None,
            }
        )
        if result["welcomed"] != connections or result["subacks"] != filters:
            raise BenchError(
                f"{result['welcomed']} of {connections} connections welcomed, "
                f"{result['subacks']} of {filters} SUBACKs: {result['errors']}"
            )
    except (BenchError, OSError, trio.TooSlowError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if worker is not None:
            worker.stop()
        if broker is not None:
            result["broker_stop"] = stop_broker(broker)
            result["broker_log_summary"] = scan_log(broker.log_path)
    result["seconds"] = round(time.monotonic() - started, 3)
    return result


def build_plan(name: str, params: dict[str, int], seed: int) -> list[list[tuple[str, str]]]:
    """Each connection's filters for scenario ``name``."""
    if name == IDLE:
        return [[] for _ in range(params["connections"])]
    if name == IDLE_SUB:
        return [[flt] for flt in subscribe_filters(params["connections"], seed)]
    filters = subscribe_filters(params["filters"], seed)
    if name == FILTERS_ONE:
        return [filters]
    spread = params["spread"]
    return [filters[k::spread] for k in range(spread)]


def derive(scenarios: dict[str, dict[str, Any]]) -> None:
    """Figures that combine scenarios: a subscription's cost on its own connection, and
    filters net of the connections holding them."""
    idle = scenarios.get(IDLE, {}).get("per_connection_bytes")
    if idle is None:
        return
    with_sub = scenarios.get(IDLE_SUB, {})
    if with_sub.get("per_connection_bytes") is not None:
        with_sub["per_subscription_net_bytes"] = with_sub["per_connection_bytes"] - idle
    for name in (FILTERS_ONE, FILTERS_SPREAD):
        r = scenarios.get(name, {})
        if r.get("rss_delta_kib") is not None and r["filters"]:
            net = r["rss_delta_kib"] * 1024 - idle * r["connections"]
            r["per_filter_net_bytes"] = round(net / r["filters"])


def check_goals(scenarios: dict[str, dict[str, Any]], params: dict[str, int]) -> Goals:
    goals = Goals()
    idle = scenarios.get(IDLE, {}).get("per_connection_bytes")
    goals.add(
        f"RSS per idle connection <= {GOAL_CONNECTION_BYTES // 1024} KiB",
        None if idle is None else f"{idle / 1024:.1f} KiB",
        None if idle is None else idle <= GOAL_CONNECTION_BYTES,
    )
    at_scale = params["filters"] >= GOAL_FILTER_COUNT
    for name, key in ((FILTERS_ONE, "per_filter_bytes"), (FILTERS_SPREAD, "per_filter_net_bytes")):
        value = scenarios.get(name, {}).get(key)
        goals.add(
            f"RSS per filter <= {GOAL_FILTER_BYTES} bytes at {GOAL_FILTER_COUNT:,} filters "
            f"({name}{', net of its connections' if 'net' in key else ''})",
            None if value is None else f"{value:,} bytes at {params['filters']:,}",
            None if value is None or not at_scale else value <= GOAL_FILTER_BYTES,
        )
    return goals


def peers_installed() -> dict[str, str]:
    return {
        name: "installed, not measured" if os.access(path, os.X_OK) else "not installed"
        for name, path in PEERS.items()
    }


def _cell(value: int | None, unit: str) -> str:
    return "-" if value is None else f"{value / 1024:.1f} KiB" if unit == "KiB" else f"{value:,} B"


def table_lines(scenarios: dict[str, dict[str, Any]]) -> list[str]:
    header = (
        f"{'scenario':<15} {'conns':>6} {'filters':>7} {'RSS before':>11} {'RSS after':>10} "
        f"{'delta':>10} {'per conn':>10} {'per filter':>11} {'net/filter':>11}"
    )
    lines = [header, "-" * len(header)]
    for name, r in scenarios.items():
        if "error" in r:
            lines.append(f"{name:<15} error: {r['error']}")
            continue
        per_conn = r["per_connection_bytes"] if name in (IDLE, IDLE_SUB) else None
        per_filter = r["per_filter_bytes"] if name in (FILTERS_ONE, FILTERS_SPREAD) else None
        lines.append(
            f"{name:<15} {r['connections']:>6,} {r['filters']:>7,} "
            f"{r['rss_before_kib'] / 1024:>7.1f} MiB {r['rss_after_kib'] / 1024:>6.1f} MiB "
            f"{r['rss_delta_kib'] / 1024:>6.1f} MiB {_cell(per_conn, 'KiB'):>10} "
            f"{_cell(per_filter, 'B'):>11} {_cell(r.get('per_filter_net_bytes'), 'B'):>11}"
        )
    sub = scenarios.get(IDLE_SUB, {}).get("per_subscription_net_bytes")
    if sub is not None:
        lines.append(f"one subscription on its own connection: {sub:,} B (idle-sub - idle)")
    lines.append(
        "net/filter: the delta less the connections at idle's per-connection figure, per filter"
    )
    return lines


def parse_args(argv: list[str] | None) -> Any:
    parser = arg_parser(__doc__, quick=f"{QUICK['connections']} connections, "
                        f"{QUICK['filters']:,} filters (CI smoke test)")  # fmt: skip
    parser.add_argument(
        "--only",
        default=",".join(ALL_SCENARIOS),
        help="comma-separated scenarios to run (default: all: %(default)s)",
    )
    parser.add_argument("--connections", type=int, help="N for idle and idle-sub")
    parser.add_argument("--filters", type=int, help="F for filters-1 and filters-spread")
    parser.add_argument("--spread", type=int, help="C: connections of filters-spread")
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument(
        "--log-dir", help="keep the broker logs here (default: a temporary directory, removed)"
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL_SCENARIOS))
    if unknown or not names:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(ALL_SCENARIOS)}")
    args.names = [n for n in ALL_SCENARIOS if n in names]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    for key in ("connections", "filters", "spread"):
        if getattr(args, key) is not None:
            params[key] = getattr(args, key)
    ctx = multiprocessing.get_context("spawn")
    nofile = raise_nofile(max(params["connections"], params["spread"]) + FD_MARGIN)
    report: dict[str, Any] = {
        "benchmark": "memory",
        "machine": common_machine_info(
            trio=trio.__version__, msgpack=".".join(map(str, msgpack.version))
        ),
        "parameters": {
            **params,
            "quick": args.quick,
            "seed": args.seed,
            "scenarios": args.names,
            "warmup_connections": WARMUP_CONNECTIONS,
            "warmup_filters": WARMUP_FILTERS,
            "nofile": nofile,
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scenarios": {},
        "peers": peers_installed(),
    }
    started = time.monotonic()
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix="topiary-memory-")
    log_dir = Path(args.log_dir or temp_dir)  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    failed = False
    print(
        f"memory: {report['machine']['cpu_count']} CPUs, Python {report['machine']['python']}, "
        f"load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    try:
        for name in args.names:
            print(f"  running {name} ...", flush=True)
            result = run_scenario(name, build_plan(name, params, args.seed), ctx, log_dir)
            if "error" in result:
                failed = True
                print(f"  {name} failed: {result['error']}", file=sys.stderr, flush=True)
            report["scenarios"][name] = result
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    derive(report["scenarios"])
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = time.monotonic() - started
    report["goals"] = check_goals(report["scenarios"], params)
    report["notes"] = [f"{name}: {status}" for name, status in report["peers"].items()]
    print()
    for line in table_lines(report["scenarios"]):
        print(line)
    print()
    print_ending(report)
    write_report(report, args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
