"""Retained messages: time to find and deliver a subscription's retained set, by answer size.

    python bench/retained.py [--sizes 10000,100000] [--answers 10,1000,10000]
                             [--repeats N] [--seconds S] [--quick] [--json PATH]

A new subscription is sent the retained message of every topic its filter matches
(``broker.core.retained``, over ``routing.RetainedTrie``). The promise: the cost grows with
the answer (how many retained messages match), not with how many topics are retained. For
each number of retained topics N (``--sizes``), the topics are

    ret/b{i // 10000}/k{(i // 1000) % 10}/d{(i // 10) % 100}/t{i % 10}    (i < N)

so the MQTT filters ``ret/b0/k0/d0/#``, ``ret/b0/k0/#`` and ``ret/b0/#`` match 10, 1,000 and
10,000 of them whatever N is (an answer above N is skipped). Payloads are 16 bytes. Two
measurements per (N, answer):

- core  ``Broker.retained_matching(filter)``: the trie walk and the list of messages, in this
        process, no I/O; the median of ``--repeats`` calls (bounded by ``--seconds`` of wall
        time per cell), in microseconds, and per message.
- e2e   a broker served in this process on 127.0.0.1 (``run_broker``, no data dir:
        retained messages in memory), filled with ``Broker.publish(..., retain=True)``
        in-process (filling is not what is measured); a topiary client on a real socket
        subscribes and reads up to the last retained MSG; time from sending the SUB to that
        MSG, the median of ``--repeats`` subscriptions (each unsubscribed before the next).
        Client and broker share this process and its one trio thread, so this is the whole
        path's CPU cost, client decoding included. The broker's outbound queue is raised to
        1,000,000 messages (a transient session's retained set is queued at once, and the
        default 10,000 would drop the excess).

Correctness (exit status 1 if it fails): every e2e subscription got exactly the answer's
topics, each MSG flagged ``retained``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import trio

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import routing  # noqa: E402
from bench.harness.report import (  # noqa: E402
    arg_parser,
    format_columns,
    machine_info,
    write_report,
)
from broker.client import connect  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.log import configure_logging  # noqa: E402
from broker.server import run_broker  # noqa: E402

DEFAULT_SIZES = (10_000, 100_000)
DEFAULT_ANSWERS = (10, 1_000, 10_000)
FULL: dict[str, Any] = {"repeats": 7, "seconds": 20.0}
QUICK: dict[str, Any] = {"repeats": 2, "seconds": 2.0}
QUICK_SIZES = (2_000,)
QUICK_ANSWERS = (10, 1_000)
PAYLOAD = b"0123456789abcdef"
#: The filter whose answer is ``count`` retained topics (mqtt dialect).
FILTERS = {10: "ret/b0/k0/d0/#", 1_000: "ret/b0/k0/#", 10_000: "ret/b0/#"}

COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("retained", "size", ","),
    ("answer", "answer", ","),
    ("filter", "filter", ""),
    ("core us", "core_us", ",.1f"),
    ("core ns/msg", "core_ns_per_message", ",.0f"),
    ("e2e ms", "e2e_ms", ",.2f"),
    ("e2e us/msg", "e2e_us_per_message", ",.2f"),
    ("correct", "correct", ""),
)


def topic(i: int) -> str:
    return f"ret/b{i // 10000}/k{(i // 1000) % 10}/d{(i // 10) % 100}/t{i % 10}"


def timed_core(broker: Any, flt: routing.Filter, repeats: int, seconds: float) -> list[float]:
    """Seconds per ``retained_matching`` call, ``repeats`` times or until ``seconds`` pass."""
    times = []
    deadline = time.perf_counter() + seconds
    for _ in range(repeats):
        began = time.perf_counter()
        broker.retained_matching(flt)
        times.append(time.perf_counter() - began)
        if time.perf_counter() > deadline:
            break
    return times


async def timed_e2e(
    address: tuple[str, int], text: str, answer: int, repeats: int, seconds: float
) -> tuple[list[float], bool]:
    """Seconds from SUB to the last retained MSG, per subscription; and whether each got
    exactly the expected topics, flagged retained."""
    expected = {topic(i) for i in range(answer)}
    times = []
    correct = True
    deadline = time.perf_counter() + seconds
    async with connect(address) as client:
        for _ in range(repeats):
            began = time.perf_counter()
            async with client.subscribe(text, dialect="mqtt", buffer=answer + 16) as sub:
                got = [await sub.get() for _ in range(answer)]
                times.append(time.perf_counter() - began)
                correct &= {m.topic for m in got} == expected and all(m.retained for m in got)
            if time.perf_counter() > deadline:
                break
    return times, correct


async def run_size(size: int, answers: list[int], counts: dict[str, Any]) -> list[dict[str, Any]]:
    config = BrokerConfig(port=0, outbound_messages=1_000_000, outbound_bytes=1 << 30)
    rows = []
    async with trio.open_nursery() as nursery:
        server = await nursery.start(run_broker, config)
        try:
            broker = server.broker
            began = time.perf_counter()
            for i in range(size):
                broker.publish(topic(i), PAYLOAD, retain=True)
            fill = time.perf_counter() - began
            assert len(broker.retained) == size
            for answer in answers:
                if answer > size:
                    continue
                text = FILTERS[answer]
                flt = routing.parse_filter(text, routing.MQTT)
                assert len(broker.retained_matching(flt)) == answer
                core = timed_core(broker, flt, counts["repeats"], counts["seconds"])
                e2e, correct = await timed_e2e(
                    server.addresses[0], text, answer, counts["repeats"], counts["seconds"]
                )
                core_s, e2e_s = statistics.median(core), statistics.median(e2e)
                rows.append(
                    {
                        "size": size,
                        "answer": answer,
                        "filter": text,
                        "fill_seconds": fill,
                        "core_us": core_s * 1e6,
                        "core_ns_per_message": core_s * 1e9 / answer,
                        "core_runs": len(core),
                        "e2e_ms": e2e_s * 1e3,
                        "e2e_us_per_message": e2e_s * 1e6 / answer,
                        "e2e_runs": len(e2e),
                        "core_seconds": core,
                        "e2e_seconds": e2e,
                        "correct": correct,
                    }
                )
                print(f"  N={size:,} answer={answer:,}: done", file=sys.stderr, flush=True)
        finally:
            server.shutdown()
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    return format_columns(rows, COLUMNS)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__, "N=2,000 only, answers 10 and 1,000, 2 repeats")
    parser.add_argument(
        "--sizes",
        default=",".join(str(s) for s in DEFAULT_SIZES),
        help="comma-separated numbers of retained topics (default: %(default)s)",
    )
    parser.add_argument(
        "--answers",
        default=",".join(str(a) for a in DEFAULT_ANSWERS),
        help=f"comma-separated answer sizes, of {sorted(FILTERS)} (default: %(default)s)",
    )
    parser.add_argument("--repeats", type=int, help="subscriptions (and core calls) per cell")
    parser.add_argument("--seconds", type=float, help="wall-time budget per cell and measurement")
    args = parser.parse_args(argv)
    counts = dict(QUICK if args.quick else FULL)
    for key in ("repeats", "seconds"):
        if getattr(args, key) is not None:
            counts[key] = getattr(args, key)
    args.counts = counts
    try:
        sizes = QUICK_SIZES if args.quick else args.sizes.split(",")
        args.size_list = [int(s) for s in sizes]
        args.answer_list = (
            list(QUICK_ANSWERS) if args.quick else [int(a) for a in args.answers.split(",")]
        )
    except ValueError:
        parser.error("--sizes and --answers must be comma-separated integers")
    if not args.size_list or min(args.size_list) < 1 or set(args.answer_list) - set(FILTERS):
        parser.error(f"--sizes must be >= 1; --answers must be among {sorted(FILTERS)}")
    if counts["repeats"] < 1 or counts["seconds"] <= 0:
        parser.error("--repeats must be >= 1, --seconds > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(level=logging.WARNING)  # the in-process broker's, on stderr
    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    for size in args.size_list:
        print(f"N={size:,}: filling and measuring ...", file=sys.stderr, flush=True)
        results += trio.run(run_size, size, args.answer_list, args.counts)
    print(format_table(results))
    correct = all(row["correct"] for row in results)
    print()
    print(f"total {time.perf_counter() - started:.1f} s; correct: {'yes' if correct else 'NO'}")
    if args.json:
        report = {
            "benchmark": "retained",
            "machine": machine_info(),
            "parameters": {
                "sizes": args.size_list,
                "answers": args.answer_list,
                "quick": args.quick,
                "counts": args.counts,
                "payload_bytes": len(PAYLOAD),
                "filters": {str(k): v for k, v in FILTERS.items()},
                "clock": "perf_counter (wall), medians",
                "broker": "in-process run_broker, no data dir, outbound_messages=1,000,000",
            },
            "results": results,
            "correct": correct,
        }
        write_report(report, args.json, sort_keys=False)
    return 0 if correct else 1


if __name__ == "__main__":
    raise SystemExit(main())
