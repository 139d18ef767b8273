"""Durable storage (``broker.store.Store``): confirmed appends/s with group commit, replay rate.

    python bench/store.py [--quick] [--json PATH] [--seconds S] [--replay-messages N]
                          [--payload-bytes N] [--data-dir DIR]

Every case opens a fresh store (SQLite in WAL mode, synchronous=FULL) in its own directory
under ``--data-dir`` (default: a new temporary directory, removed afterwards). fsync speed
decides the single-appender figure, so the JSON records the file system of the data dir.

1. append   one durable session; C appender tasks (C = 1, 10, 100) each loop: take the next
            seq, ``append`` a message (``--payload-bytes``, default 200, one header) with one
            delivery for that seq, and wait until it is committed; for ``--seconds`` (2 s,
            0.5 s with ``--quick``). Confirmed appends/s, transactions (batches) committed, the
            mean batch size and the latency of one append (p50, p99). With C = 1 every append
            pays a whole commit (an fsync); with more appenders, group commit shares it.
2. replay   append N messages (100,000; 10,000 with ``--quick``) to one session, untimed (100
            appenders), then read them all back with ``pending(client, after, limit=1000)``
            pages, each page starting after the last seq of the previous one: messages/s. The
            seqs read must be exactly 1..N in order.

The goals (informational): >= 20,000 confirmed appends/s with group commit (the best of the
concurrent rows), replay >= 50,000 messages/s. The exit status is 0 unless a check failed (1).
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.harness.report import arg_parser, file_system, write_report  # noqa: E402
from bench.harness.report import machine_info as common_machine_info  # noqa: E402
from broker.store import Store  # noqa: E402

CONCURRENCY = (1, 10, 100)
REPLAY_PAGE = 1_000
REPLAY_APPENDERS = 100
FULL = {"seconds": 2.0, "replay_messages": 100_000}
QUICK = {"seconds": 0.5, "replay_messages": 10_000}
GOAL_APPENDS = 20_000
GOAL_REPLAY = 50_000
CLIENT = "bench"

COLUMNS: tuple[tuple[str, str, str], ...] = (
    # (header, result key, format)
    ("case", "case", ""),
    ("concurrency", "concurrency", "d"),
    ("ops", "operations", ",d"),
    ("seconds", "seconds", ".2f"),
    ("per second", "per_second", ",.0f"),
    ("commits", "batches", ",d"),
    ("mean batch", "mean_batch", ".1f"),
    ("p50 ms", "p50_ms", ".2f"),
    ("p99 ms", "p99_ms", ".2f"),
)


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(fraction * (len(sorted_values) - 1)))
    return sorted_values[index]


async def measure_appends(
    data_dir: Path, concurrency: int, seconds: float, payload: bytes
) -> dict[str, Any]:
    """Confirmed appends/s with ``concurrency`` appenders on one session for ``seconds``."""
    async with Store.open(data_dir) as store:
        await store.create_session(CLIENT, None)
        before = store.statistics()
        next_seq = 1
        latencies: list[float] = []
        perf = time.perf_counter
        start = perf()
        deadline = start + seconds

        async def appender() -> None:
            nonlocal next_seq
            while perf() < deadline:
                seq = next_seq
                next_seq += 1
                began = perf()
                await store.append(
                    msg_id=f"m{seq}",
                    topic="bench/store/append",
                    payload=payload,
                    headers={"content-type": "application/octet-stream"},
                    deliveries=[(CLIENT, seq)],
                )
                latencies.append(perf() - began)

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(appender)
        elapsed = perf() - start
        after = store.statistics()
        record = await store.session(CLIENT)
    done = len(latencies)
    assert record is not None and record.pending == done, (record, done)
    batches = after.batches_committed - before.batches_committed
    latencies.sort()
    return {
        "case": "append",
        "concurrency": concurrency,
        "operations": done,
        "seconds": elapsed,
        "per_second": done / elapsed if elapsed > 0 else 0.0,
        "batches": batches,
        "mean_batch": (after.operations - before.operations) / batches if batches else 0.0,
        "max_batch": after.max_batch_size,
        "p50_ms": _percentile(latencies, 0.5) * 1000,
        "p99_ms": _percentile(latencies, 0.99) * 1000,
        "mean_ms": statistics.fmean(latencies) * 1000 if latencies else 0.0,
        "db_size_bytes": after.db_size_bytes,
    }


async def measure_replay(data_dir: Path, messages: int, payload: bytes) -> dict[str, Any]:
    """Append ``messages`` to one session (untimed), then read them back in pages."""
    async with Store.open(data_dir) as store:
        await store.create_session(CLIENT, None)
        seqs = iter(range(1, messages + 1))

        async def appender() -> None:
            for seq in seqs:
                await store.append(
                    msg_id=f"m{seq}",
                    topic="bench/store/replay",
                    payload=payload,
                    headers={"content-type": "application/octet-stream"},
                    deliveries=[(CLIENT, seq)],
                )

        async with trio.open_nursery() as nursery:
            for _ in range(REPLAY_APPENDERS):
                nursery.start_soon(appender)

        read = 0
        last = 0
        in_order = True
        page_times: list[float] = []
        perf = time.perf_counter
        start = perf()
        while True:
            began = perf()
            page = await store.pending(CLIENT, last, REPLAY_PAGE)
            page_times.append(perf() - began)
            if not page:
                break
            for message in page:
                in_order = in_order and message.seq == last + 1
                last = message.seq
            read += len(page)
        elapsed = perf() - start
    page_times.sort()
    return {
        "case": "replay",
        "concurrency": None,
        "operations": read,
        "seconds": elapsed,
        "per_second": read / elapsed if elapsed > 0 else 0.0,
        "batches": None,
        "mean_batch": None,
        "p50_ms": _percentile(page_times, 0.5) * 1000,  # per page of REPLAY_PAGE
        "p99_ms": _percentile(page_times, 0.99) * 1000,
        "page_size": REPLAY_PAGE,
        "complete_and_in_order": in_order and read == messages,
    }


async def run_all(args: argparse.Namespace, data_root: Path) -> list[dict[str, Any]]:
    payload = bytes(range(256)) * (args.payload_bytes // 256) + bytes(args.payload_bytes % 256)
    results = []
    for concurrency in CONCURRENCY:
        print(f"append, concurrency {concurrency} ...", file=sys.stderr, flush=True)
        data_dir = data_root / f"append-{concurrency}"
        results.append(await measure_appends(data_dir, concurrency, args.seconds, payload))
    print(f"replay of {args.replay_messages:,} messages ...", file=sys.stderr, flush=True)
    results.append(await measure_replay(data_root / "replay", args.replay_messages, payload))
    return results


# -- report -------------------------------------------------------------------------------------


def _cell(value: Any, fmt: str) -> str:
    if value is None:
        return "-"
    return format(value, fmt)


def format_table(results: list[dict[str, Any]]) -> str:
    rows = [[header for header, _, _ in COLUMNS]]
    rows += [[_cell(r.get(key), fmt) for _, key, fmt in COLUMNS] for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"(replay: per second = messages read; p50/p99 = one page of {REPLAY_PAGE:,})")
    return "\n".join(lines)


def check_goals(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    grouped = [r["per_second"] for r in results if r["case"] == "append" and r["concurrency"] > 1]
    replay = [r["per_second"] for r in results if r["case"] == "replay"]

    def goal(name: str, measured: float | None, target: float) -> dict[str, Any]:
        status = "not measured" if measured is None else "PASS" if measured >= target else "FAIL"
        return {"goal": name, "measured": measured, "target": target, "status": status}

    return [
        goal(
            f"confirmed appends/s with group commit >= {GOAL_APPENDS:,}",
            max(grouped) if grouped else None,
            GOAL_APPENDS,
        ),
        goal(f"replay >= {GOAL_REPLAY:,} messages/s", replay[0] if replay else None, GOAL_REPLAY),
    ]


def machine_info(data_root: Path) -> dict[str, Any]:
    return common_machine_info(
        sqlite=sqlite3.sqlite_version, data_dir_file_system=file_system(data_root)
    )


# -- command line -------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__, "short runs, 10,000-message replay")
    parser.add_argument("--seconds", type=float, help="seconds per append row (2; quick 0.5)")
    parser.add_argument(
        "--replay-messages", type=int, help="messages in the replay (100,000; quick 10,000)"
    )
    parser.add_argument("--payload-bytes", type=int, default=200, help="default: %(default)s")
    parser.add_argument("--data-dir", help="where the stores go (default: a temporary dir)")
    args = parser.parse_args(argv)
    counts = QUICK if args.quick else FULL
    if args.seconds is None:
        args.seconds = counts["seconds"]
    if args.replay_messages is None:
        args.replay_messages = counts["replay_messages"]
    if args.seconds <= 0 or args.replay_messages < 1 or args.payload_bytes < 0:
        parser.error("--seconds must be > 0, --replay-messages >= 1, --payload-bytes >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.data_dir is not None:
        data_root = Path(args.data_dir)
        data_root.mkdir(parents=True, exist_ok=True)
        cleanup = False
    else:
        data_root = Path(tempfile.mkdtemp(prefix="topiary-bench-store-"))
        cleanup = True
    try:
        for leftover in ("replay", *(f"append-{c}" for c in CONCURRENCY)):
            shutil.rmtree(data_root / leftover, ignore_errors=True)
        results = trio.run(run_all, args, data_root)
        machine = machine_info(data_root)
    finally:
        if cleanup:
            shutil.rmtree(data_root, ignore_errors=True)

    print(format_table(results))
    goals = check_goals(results)
    print()
    print("check against goals (informational):")
    for g in goals:
        measured = "" if g["measured"] is None else f" (measured {g['measured']:,.0f})"
        print(f"  {g['status']:>12}  {g['goal']}{measured}")
    replay_ok = all(r.get("complete_and_in_order", True) for r in results)
    if not replay_ok:
        print("CHECK FAILED: the replay did not read back 1..N in order", file=sys.stderr)

    if args.json:
        report = {
            "benchmark": "store",
            "machine": machine,
            "parameters": {
                "quick": args.quick,
                "seconds_per_append_row": args.seconds,
                "replay_messages": args.replay_messages,
                "replay_page": REPLAY_PAGE,
                "replay_appenders": REPLAY_APPENDERS,
                "payload_bytes": args.payload_bytes,
                "concurrency": list(CONCURRENCY),
                "synchronous": "FULL",
            },
            "results": results,
            "goals": goals,
            "replay_complete_and_in_order": replay_ok,
        }
        write_report(report, args.json, sort_keys=False)
    return 0 if replay_ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
