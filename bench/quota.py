"""Confirmed-publish rate into a durable session at its quota (drop-oldest) vs below it.

    python bench/quota.py [--quick] [--json PATH] [--seconds S] [--rounds K] [--tasks N]
                          [--limit M]

Why: a durable session that is away keeps every message for its client up to ``[sessions]
max_messages``; past it, with ``overflow = "drop-oldest"``, each new message also drops the
oldest one. Before the store coalesced those trims (merged at f910e09), that regime halved a
broker's confirmed-publish rate; this measures what it costs now.

Set-up: two ``topiary serve --data-dir`` processes, both up for the whole run, each with one
away durable session on ``bench/>``: "at quota" with ``max_messages = M`` (``--limit``,
default 1,000), filled past it before any phase, and "below quota" with a limit far above
what a run stores. Phases of S seconds (``--seconds``, default 3) in ABBA rounds (``--rounds``,
default 4): N trio tasks (``--tasks``, default 128) on one connection, each awaiting
``publish(..., confirm=True)`` of 500 bytes in a loop. Per round, ratio = the at-quota rate /
the below-quota rate of the adjacent phase. Reported per setup: median rate, broker CPU per
confirmed message (``/proc``), and the messages its quota dropped during the phases, which
must equal the confirmed publishes at quota (each drops one) and be 0 below it.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness.confirms import publish_confirmed_for  # noqa: E402
from bench.harness.processes import (  # noqa: E402
    HOST,
    BrokerProcess,
    broker_stats,
    start_broker,
    stop_broker,
)
from bench.harness.procfs import cpu_seconds  # noqa: E402
from bench.harness.report import (  # noqa: E402
    arg_parser,
    format_columns,
    machine_info,
    write_report,
)
from broker.client import connect  # noqa: E402

PAYLOAD = b"x" * 500
TOPIC = "bench/quota"
SESSION = "bench-quota"
UNLIMITED = 1_000_000_000


def _config(path: Path, limit: int) -> Path:
    path.write_text(
        f'[sessions]\nmax_messages = {limit}\nmax_bytes = {1 << 40}\noverflow = "drop-oldest"\n'
    )
    return path


async def _prepare(port: int, fill: int) -> None:
    """The away durable session, then ``fill`` messages stored for it (confirmed)."""
    async with (
        connect((HOST, port), client_id=SESSION, durable=True) as session,
        session.subscribe("bench/>"),
    ):
        await session.ping()
    async with connect((HOST, port)) as client:
        for start in range(0, fill, 100):
            async with trio.open_nursery() as nursery:
                for _ in range(min(100, fill - start)):
                    nursery.start_soon(client.publish, TOPIC, PAYLOAD)
            await client.publish(TOPIC, PAYLOAD, confirm=True)


async def _phase(port: int, tasks: int, seconds: float) -> tuple[int, float]:
    """``tasks`` publishers awaiting confirms for ``seconds``: (confirmed, elapsed s)."""
    async with connect((HOST, port)) as client:
        return await publish_confirmed_for(client, TOPIC, PAYLOAD, tasks, seconds)


def _measure(broker: BrokerProcess, tasks: int, seconds: float) -> dict[str, Any]:
    dropped = broker_stats(broker.port)["quota_dropped"]
    cpu = cpu_seconds(broker.pid)
    confirmed, elapsed = trio.run(_phase, broker.port, tasks, seconds)
    cpu = cpu_seconds(broker.pid) - cpu
    return {
        "confirmed": confirmed,
        "per_second": confirmed / elapsed,
        "cpu_seconds": cpu,
        "quota_dropped": broker_stats(broker.port)["quota_dropped"] - dropped,
    }


def run(tasks: int, seconds: float, rounds: int, limit: int, work: Path) -> dict[str, Any]:
    setups = {"at quota": limit, "below quota": UNLIMITED}
    brokers: dict[str, BrokerProcess] = {}
    phases: dict[str, list[dict[str, Any]]] = {name: [] for name in setups}
    try:
        for index, (name, max_messages) in enumerate(setups.items()):
            config = _config(work / f"{index}.toml", max_messages)
            brokers[name] = start_broker(
                work / f"{index}.log", data_dir=work / f"data{index}", config=config
            )
            # Past the limit at quota (so every phase drops), as many below it (the same size).
            trio.run(_prepare, brokers[name].port, limit + 200)
        order = list(setups)
        for r in range(rounds):
            for name in order if r % 2 == 0 else order[::-1]:  # ABBA
                phases[name].append(_measure(brokers[name], tasks, seconds))
            at, below = phases["at quota"][-1], phases["below quota"][-1]
            print(f"round {r + 1}/{rounds}: at quota {at['per_second']:.0f}/s, below "
                  f"{below['per_second']:.0f}/s, ratio "
                  f"{at['per_second'] / below['per_second']:.2f}", file=sys.stderr)  # fmt: skip
    finally:
        for broker in brokers.values():
            stop_broker(broker)
    rows = []
    for name, measured in phases.items():
        confirmed = sum(p["confirmed"] for p in measured)
        rows.append({
            "setup": name,
            "max_messages": setups[name],
            "per_second": statistics.median(p["per_second"] for p in measured),
            "rates": [p["per_second"] for p in measured],
            "cpu_us": sum(p["cpu_seconds"] for p in measured) / max(confirmed, 1) * 1e6,
            "confirmed": confirmed,
            "quota_dropped": sum(p["quota_dropped"] for p in measured),
        })  # fmt: skip
    ratios = [
        a["per_second"] / b["per_second"]
        for a, b in zip(phases["at quota"], phases["below quota"], strict=True)
    ]
    at_quota, below = rows
    return {
        "benchmark": "quota",
        "machine": machine_info(),
        "tasks": tasks,
        "seconds": seconds,
        "rounds": rounds,
        "limit": limit,
        "rows": rows,
        "ratios": ratios,
        "ratio": statistics.median(ratios),
        # Every confirmed publish at quota dropped exactly one message; none below it.
        "drops_exact": at_quota["quota_dropped"] == at_quota["confirmed"]
        and below["quota_dropped"] == 0,
    }


def main() -> None:
    parser = arg_parser(__doc__, quick="2 rounds of 0.5 s phases, 16 tasks")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per phase")
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds")
    parser.add_argument("--tasks", type=int, default=128, help="publisher tasks")
    parser.add_argument("--limit", type=int, default=1000, help="max_messages at quota")
    args = parser.parse_args()
    if args.rounds < 1 or args.tasks < 1 or args.limit < 1 or args.seconds <= 0:
        parser.error("--rounds, --tasks and --limit must be at least 1, --seconds above 0")
    seconds, rounds, tasks = (0.5, 2, 16) if args.quick else (args.seconds, args.rounds, args.tasks)
    with tempfile.TemporaryDirectory(prefix="topiary-bench-quota-") as work:
        report = run(tasks, seconds, rounds, args.limit, Path(work))
    print(f"{rounds} ABBA rounds of {seconds:g} s phases, {tasks} tasks awaiting confirms, "
          f"500-byte payloads; an away durable session, drop-oldest")  # fmt: skip
    print(format_columns(report["rows"], (
        ("setup", "setup", ""), ("max_messages", "max_messages", ","),
        ("confirmed/s (median)", "per_second", ",.0f"), ("broker CPU us/msg", "cpu_us", ".1f"),
        ("dropped by the quota", "quota_dropped", ","),
    )))  # fmt: skip
    print(f"ratio at quota / below, median of the rounds: {report['ratio']:.2f} "
          f"({' '.join(f'{r:.2f}' for r in report['ratios'])})")  # fmt: skip
    print(f"drops exact (one per confirmed publish at quota, none below): "
          f"{'yes' if report['drops_exact'] else 'NO'}")  # fmt: skip
    write_report(report, args.json)


if __name__ == "__main__":
    main()
