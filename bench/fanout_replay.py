"""Filtered fan-out replayed in one process: topiary's CPU per message beside the trio relay's.

    python bench/fanout_replay.py [--quick] [--json PATH] [--sizes 1000,10000]
                                  [--messages N] [--repeat N] [--seed N] [--only topiary|relay]

The noise-robust view of bench/sidebyside.py's throughput phase (issue 18): no sockets, no
other processes, ``time.process_time`` around the broker's own work, so a loaded machine
moves it far less than it moves the running benchmark's rates. Per size S:

- the publisher's stream: ``workload.topics(N, seed)`` as plain native PUBs with the
  benchmark's payloads (200-800 bytes, timestamp and index first), the bytes the benchmark's
  publisher writes, cut into reads of 256 KiB (``broker.net.RECEIVE_SIZE``);
- topiary: a ``Broker`` configured as bench/harness/peers.py configures topiary, four
  transient sessions holding the first S portable filters round-robin (as the benchmark's
  four subscriber connections), and the publisher's session; each read goes to
  ``Connection.receive_data`` and ``Requests.handle`` in turns exactly as the native reader
  (broker/native/connection.py) does, and each subscriber's direct write
  (``Session.direct``) encodes its batch as the writer does and drops the bytes;
- the relay: bench/harness/relay.py's ``Relay.feed`` on the same reads, the owed bytes
  joined per peer as its trio loop does, then dropped.

Reported per S and side: CPU µs per message (the minimum over ``--repeat`` fresh runs, and
the median), deliveries and bytes out (the same every run; a change that alters what is
delivered shows here), and topiary / relay. Run it from two checkouts, alternating, to
compare a change with main (docs/benchmarks.md says how). On a shared machine the
figures move with the load; ``--turn-calls N`` makes the work independent of the clock, so
that ``valgrind --tool=callgrind`` counts the same instructions run after run.
"""

from __future__ import annotations

import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402

import routing  # noqa: E402
from bench.harness.crossload import (  # noqa: E402
    FILLER,
    HEADER,
    payload_sizes,
    portable_subscriptions,
    publisher_topics,
    split,
)
from bench.harness.relay import Peer, Relay  # noqa: E402
from bench.harness.report import arg_parser, machine_info, write_report  # noqa: E402
from broker.config import BrokerConfig  # noqa: E402
from broker.core import Broker, Session  # noqa: E402
from broker.core.session import flush_wakes, hold_wakes  # noqa: E402
from broker.native.confirms import Confirms  # noqa: E402
from broker.native.connection import BATCH_BYTES, HELD_TURNS, _append_discarded  # noqa: E402
from broker.native.requests import Requests  # noqa: E402
from broker.net import RECEIVE_SIZE  # noqa: E402
from broker.wire.codec import append_msg, append_msg_run, encode_pub  # noqa: E402
from broker.wire.connection import NEED_DATA, Connection, Role  # noqa: E402
from broker.wire.frames import Hello, Welcome  # noqa: E402

SIZES = (1_000, 10_000)
MESSAGES = 100_000
REPEAT = 3
CONNECTIONS = 4
PAYLOAD_SIZES = (200, 800)
#: As bench/harness/peers.py's TOPIARY_CONFIG: queue, don't drop.
LIMITS: dict[str, Any] = {
    "outbound_messages": 1_000_000,
    "outbound_bytes": 256 * 1024 * 1024,
    "slow_consumer_drops": 1_000_000,
}


def publisher_reads(count: int, seed: int) -> list[bytes]:
    """The publisher's PUBs for ``count`` messages (as bench/harness/crossload.py's
    ``Publisher`` builds them), cut into the reads a broker would make."""
    topics = publisher_topics(count, seed)
    sizes = payload_sizes(count, seed, *PAYLOAD_SIZES)
    stamp = time.monotonic_ns().to_bytes(8, "big")
    stream = b"".join(
        encode_pub(topic, b"".join((stamp, i.to_bytes(8, "big"), FILLER[: size - HEADER])))
        for i, (topic, size) in enumerate(zip(topics, sizes, strict=True))
    )
    return [stream[at : at + RECEIVE_SIZE] for at in range(0, len(stream), RECEIVE_SIZE)]


def _tune_gc() -> None:
    """What ``topiary serve`` (broker/commands.py ``tune_gc``) and the relays do at start."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(10_000, 0, 500)


class _Parked:
    """Stands for a subscriber's writer task parked in ``wait_data`` (never rescheduled:
    every direct write takes the whole queue, in batches as the writer would)."""


class Subscriber:
    """A subscriber connection's direct write: what ``ClientConnection._direct`` encodes,
    counted and dropped."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.messages = 0
        self.bytes = 0
        self.writes = 0

    def direct(self) -> bool:
        # (what one batch leaves, the woken writer would take in the next: one write each)
        while self.session.queued:
            data, messages = self.session.take_batch(
                append_msg, BATCH_BYTES, _append_discarded, append_run=append_msg_run
            )
            self.messages += messages
            self.bytes += len(data)
            self.writes += 1
            self.session.sampled.clear()
        return True


def _open_server() -> Connection:
    proto = Connection(Role.SERVER)
    hello = Hello(version=1, client_id="publisher")
    proto.receive_data(Connection(Role.CLIENT).send(hello))
    proto.next_event()
    welcome = Welcome(
        version=1, client_id="publisher", server_id="replay", max_frame=1 << 20, keepalive=30
    )
    proto.send(welcome)
    proto.plain_pubs = True  # as ClientConnection._serve_session sets it
    return proto


async def _topiary(filters: list[str], reads: list[bytes], turn_calls: int = 0) -> dict[str, Any]:
    broker = Broker(BrokerConfig(**LIMITS))
    subscribers = []
    for k, part in enumerate(split(filters, CONNECTIONS)):
        session = broker.open_session(f"sub-{k}")
        broker.subscribe_many(session, [routing.parse_filter(text) for text in part])
        subscriber = Subscriber(session)
        session.direct = subscriber.direct
        session._writer = _Parked()  # type: ignore[assignment]
        subscribers.append(subscriber)
    session = broker.open_session("publisher")
    proto = _open_server()
    requests = Requests(broker, proto, session, Confirms(session, proto))
    handle = requests.handle
    turn_frames = broker.config.turn_frames
    turn_time = broker.config.turn_time
    clock = trio.current_time
    _tune_gc()
    started = time.process_time()
    # ClientConnection._reader's loop, less the socket and the yields: a read, its turns,
    # the flushes.
    for data in reads:
        proto.receive_data(data)
        turn_began = clock()
        calls = 0
        held_turns = 0
        hold_wakes()
        while True:
            stop = await handle(proto.next_events(turn_frames))
            calls += 1
            if stop is None:
                if (calls < turn_calls) if turn_calls else (clock() - turn_began < turn_time):
                    continue
                held_turns += 1
                if held_turns >= HELD_TURNS:
                    flush_wakes()
                    held_turns = 0
                    hold_wakes()
                turn_began = clock()
                calls = 0
                continue
            flush_wakes()
            if stop is not NEED_DATA:
                raise RuntimeError(f"the replay's stream ended with {stop!r}")
            break
    seconds = time.process_time() - started
    gc.unfreeze()
    return {
        "seconds": seconds,
        "deliveries": sum(s.messages for s in subscribers),
        "bytes_out": sum(s.bytes for s in subscribers),
        "writes": sum(s.writes for s in subscribers),
        "dropped": broker.counters.dropped,
    }


def _relay(filters: list[str], reads: list[bytes]) -> dict[str, Any]:
    relay = Relay()
    for k, part in enumerate(split(filters, CONNECTIONS)):
        peer = Peer(100 + k)
        for text in part:
            relay.table.add(text, peer)
    publisher = Peer(99)
    deliveries = out_bytes = writes = 0
    _tune_gc()
    started = time.process_time()
    for data in reads:
        for other in relay.feed(publisher, data):  # as _serve_trio: one join per peer
            out = b"".join(other.out)
            deliveries += len(other.out)
            other.out.clear()
            out_bytes += len(out)
            writes += 1
    seconds = time.process_time() - started
    gc.unfreeze()
    return {"seconds": seconds, "deliveries": deliveries, "bytes_out": out_bytes, "writes": writes}


def measure(
    size: int, messages: int, repeat: int, seed: int, sides: list[str], turn_calls: int = 0
) -> dict[str, Any]:
    """Both sides on the same reads, ``repeat`` fresh runs each, alternating."""
    filters, _drawn = portable_subscriptions(size, seed)
    reads = publisher_reads(messages, seed)
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for _ in range(repeat):
        for side in sides:
            if side == "topiary":
                runs[side].append(trio.run(_topiary, filters, reads, turn_calls))
            else:
                runs[side].append(_relay(filters, reads))
    result: dict[str, Any] = {"size": size, "messages": messages}
    for side, rows in runs.items():
        per_message = [row["seconds"] / messages * 1e6 for row in rows]
        last = rows[-1]
        result[side] = {
            "us_per_message_min": round(min(per_message), 3),
            "us_per_message_median": round(statistics.median(per_message), 3),
            "us_per_message": [round(x, 3) for x in per_message],
            "deliveries": last["deliveries"],
            "bytes_out": last["bytes_out"],
            "writes": last["writes"],
            **({"dropped": last["dropped"]} if "dropped" in last else {}),
        }
    if "topiary" in result and "relay" in result:
        result["topiary_over_relay"] = round(
            result["topiary"]["us_per_message_min"] / result["relay"]["us_per_message_min"], 3
        )
    return result


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| S | side | µs/msg min | µs/msg median | deliveries | bytes out | writes | / relay |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for result in results:
        for side in ("topiary", "relay"):
            row = result.get(side)
            if row is None:
                continue
            ratio = ""
            if side == "topiary" and "topiary_over_relay" in result:
                ratio = f"{result['topiary_over_relay']:.2f}x"
            lines.append(
                f"| {result['size']:,} | {side} | {row['us_per_message_min']:.2f} | "
                f"{row['us_per_message_median']:.2f} | {row['deliveries']:,} | "
                f"{row['bytes_out']:,} | {row['writes']:,} | {ratio} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = arg_parser(__doc__ or "", quick="S = 1,000, 5,000 messages, one run (a smoke test)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)))
    parser.add_argument("--messages", type=int, default=MESSAGES)
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("topiary", "relay"))
    parser.add_argument(
        "--turn-calls",
        type=int,
        default=0,
        metavar="N",
        help="end topiary's turns after N next_events calls, not after turn_time: the same "
        "work whatever the clock says (for instruction counts under valgrind)",
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    messages, repeat = args.messages, args.repeat
    if args.quick:
        sizes, messages, repeat = [1_000], 5_000, 1
    sides = [args.only] if args.only else ["topiary", "relay"]
    results = [measure(size, messages, repeat, args.seed, sides, args.turn_calls) for size in sizes]
    print("\n".join(table(results)))
    report = {
        "benchmark": "fanout_replay",
        "machine": machine_info(),
        "messages": messages,
        "repeat": repeat,
        "results": results,
    }
    write_report(report, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
