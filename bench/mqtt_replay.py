"""The MQTT port's CPU per message without sockets: bench/mqtt_sidebyside.py's traffic replayed.

    python bench/mqtt_replay.py [--quick] [--sizes 1000,10000] [--messages N]
                                [--latency-messages N] [--level 4|5] [--reps N] [--seed N]
                                [--json PATH] [--profile]

Issue 17's p99 follows the broker's CPU per wake-up (docs/benchmarks.md, "p99 at 2,000
msg/s"), and on the shared 2-core machine a running broker's CPU time moves with the load.
This replays the side-by-side workload through the MQTT front end's own code in one
process, where only the code changes the figure:

- 4 subscriber connections (``MqttConnection``, CONNECT through ``accept_connect``) holding
  the first S portable filters of the workload round-robin, at QoS 0 through
  ``Requests.handle`` (SUBSCRIBE), each with its writer task parked and its direct writes
  (``Outbound.direct``) going to /dev/null: encoded and dropped by the kernel;
- one publisher connection whose reader (``MqttConnection._reader``, the real loop: turns,
  held wakes, flush) reads the workload's QoS 0 PUBLISHes (200-800 B payloads) from a stream
  that returns them as the reader got them in each phase of the benchmark: 256 KiB reads
  (``throughput``) or 2 PUBLISHes per read (``latency``: 2,000 msg/s, one publisher batch
  per ~1 ms wake-up);
- ``time.process_time`` across the publisher's reader, per message; every message's
  deliveries are checked against the filters (``routing.SubscriptionTable``).

``--level 5`` makes every client MQTT 5 (no properties), the benchmark's clients are
3.1.1. Each size and shape runs ``--reps`` times with a fresh broker; the table gives the
min and median. Compare two trees by running this alternately with each on PYTHONPATH.
``--quick``: S = 1,000, 2,000 and 1,000 messages, one run each (a smoke test).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
import trio.testing  # noqa: E402

import routing  # noqa: E402
from bench.harness.clients.topics import wire_filter  # noqa: E402
from bench.harness.crossload import (  # noqa: E402
    FILLER,
    HEADER,
    payload_sizes,
    portable_subscriptions,
    publisher_topics,
    split,
)
from broker.config import BrokerConfig  # noqa: E402
from broker.core import Broker  # noqa: E402
from broker.log import configure_logging  # noqa: E402
from broker.mqtt.codec import encode  # noqa: E402
from broker.mqtt.connect import accept_connect  # noqa: E402
from broker.mqtt.connection import MqttConnection  # noqa: E402
from broker.mqtt.outbound import Outbound  # noqa: E402
from broker.mqtt.packets import Connect, Publish, Subscribe, Subscription  # noqa: E402
from broker.mqtt.requests import Requests  # noqa: E402
from broker.mqtt.state import MqttFrontEnd  # noqa: E402
from broker.net import RECEIVE_SIZE  # noqa: E402

CONNECTIONS = 4
PAYLOAD_SIZES = (200, 800)  # bench/sidebyside.py's
LATENCY_PER_READ = 2  # 2,000 msg/s, a publisher batch per ~1 ms wake-up
SUBSCRIBE_BATCH = 500  # filters per SUBSCRIBE


class ReplayStream:
    """What the reader reads: the given chunks, one per ``receive_some``, then EOF; what is
    sent to it is dropped (the writers' CONNACK and SUBACK)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.at = 0

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()  # a socket read yields to the scheduler too
        if self.at == len(self.chunks):
            return b""
        chunk = self.chunks[self.at]
        self.at += 1
        return chunk

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await trio.lowlevel.checkpoint()

    async def aclose(self) -> None:
        pass


def publishes(count: int, seed: int, level: int) -> list[bytes]:
    """The publisher's PUBLISH packets: the workload's topics in order, 200-800 B payloads
    carrying a (fixed) timestamp and the index, as bench/harness/crossload.py makes them."""
    topics = publisher_topics(count, seed)
    sizes = payload_sizes(count, seed, *PAYLOAD_SIZES)
    stamp = time.monotonic_ns().to_bytes(8, "big")
    return [
        encode(Publish(topic, stamp + i.to_bytes(8, "big") + FILLER[: size - HEADER]), level)
        for i, (topic, size) in enumerate(zip(topics, sizes, strict=True))
    ]


def chunks_for(packets: list[bytes], shape: str) -> list[bytes]:
    """The reads the broker's reader gets in ``shape``: 256 KiB of the stream at a time
    (``throughput``) or ``LATENCY_PER_READ`` packets (``latency``)."""
    if shape == "latency":
        return [
            b"".join(packets[i : i + LATENCY_PER_READ])
            for i in range(0, len(packets), LATENCY_PER_READ)
        ]
    stream = b"".join(packets)
    return [stream[i : i + RECEIVE_SIZE] for i in range(0, len(stream), RECEIVE_SIZE)]


def owed(topics: list[str], conns: list[list[str]]) -> int:
    """Deliveries the broker owes: per message, the connections with a matching filter."""
    table = routing.SubscriptionTable()
    for k, flts in enumerate(conns):
        for text in flts:
            table.add(routing.parse_filter(text), k)
    return sum(len(table.match(topic)) for topic in topics)


async def _connect(
    broker: Broker, frontend: MqttFrontEnd, name: str, level: int, chunks: list[bytes]
) -> tuple[MqttConnection, Requests]:
    """A connection through CONNECT, its writer to start; its reader reads ``chunks``."""
    stream = ReplayStream([encode(Connect(name, level, keepalive=0), level), *chunks])
    conn = MqttConnection(broker, frontend, stream, peer=name)  # type: ignore[arg-type]
    accepted = await accept_connect(conn)
    assert accepted is not None, f"{name}: CONNECT refused"
    conn.session = accepted.session
    conn.accepted = accepted
    outbound = conn.outbound = Outbound(conn, accepted)
    requests = Requests(conn, accepted, outbound)
    return conn, requests


async def replay_once(
    conns: list[list[str]], chunks: list[bytes], level: int, sink: int
) -> dict[str, Any]:
    """One run on a fresh broker: the publisher's reader's CPU seconds and what it sent."""
    config = dataclasses.replace(
        BrokerConfig(),
        outbound_messages=1_000_000,
        outbound_bytes=268_435_456,
        slow_consumer_drops=1_000_000,
    )  # bench/harness/peers.py's TOPIARY_CONFIG
    broker = Broker(config)
    frontend = MqttFrontEnd(broker)
    async with trio.open_nursery() as nursery:
        subscribers = []
        for k, flts in enumerate(conns):
            conn, requests = await _connect(broker, frontend, f"sub{k}", level, [])
            requests.start_in(nursery)
            wanted = [Subscription(wire_filter("mqtt", text)) for text in flts]
            for at in range(0, len(wanted), SUBSCRIBE_BATCH):
                packet = Subscribe(at // SUBSCRIBE_BATCH + 1, wanted[at : at + SUBSCRIBE_BATCH])
                assert requests.handle(packet) is None
                assert await requests.run_later() is None
            assert conn.outbound is not None
            conn.outbound.write_directly(sink, conn._last_word_due)
            nursery.start_soon(conn.outbound.run_writer, conn._writer_done, conn._last_word_due)
            subscribers.append(conn)
        pub, requests = await _connect(broker, frontend, "pub", level, chunks)
        requests.start_in(nursery)
        assert pub.outbound is not None
        nursery.start_soon(pub.outbound.run_writer, pub._writer_done, pub._last_word_due)
        await trio.testing.wait_all_tasks_blocked()  # every writer parked, replies sent
        counters = broker.counters
        sent_before = counters.bytes_sent
        gc.collect()
        cpu = time.process_time()
        await pub._reader(requests)
        seconds = time.process_time() - cpu
        await trio.testing.wait_all_tasks_blocked()
        queued = sum(conn.session.queued for conn in subscribers if conn.session is not None)
        nursery.cancel_scope.cancel()
    return {
        "seconds": seconds,
        "deliveries": counters.messages_out,
        "bytes_sent": counters.bytes_sent - sent_before,
        "left_queued": queued,
        "dropped": counters.dropped,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    shapes = {"throughput": args.messages, "latency": args.latency_messages}
    packets_by_count: dict[int, list[bytes]] = {}
    with open(os.devnull, "wb") as devnull:
        for size in args.sizes:
            filters, _drawn = portable_subscriptions(size, args.seed)
            conns = split(filters, CONNECTIONS)
            for shape, count in shapes.items():
                if not count:
                    continue
                if count not in packets_by_count:
                    packets_by_count[count] = publishes(count, args.seed, args.level)
                chunks = chunks_for(packets_by_count[count], shape)
                expected = owed(publisher_topics(count, args.seed), conns)
                results = []
                for _ in range(args.reps):
                    if args.profile:
                        import cProfile
                        import pstats

                        profile = cProfile.Profile()
                        profile.enable()
                    result = trio.run(replay_once, conns, chunks, args.level, devnull.fileno())
                    if args.profile:
                        profile.disable()
                        print(f"-- S = {size:,}, {shape} --")
                        pstats.Stats(profile).sort_stats("tottime").print_stats(30)
                    if result["deliveries"] != expected or result["left_queued"]:
                        raise SystemExit(
                            f"S = {size}, {shape}: {result['deliveries']} deliveries, "
                            f"{expected} owed, {result['left_queued']} left queued"
                        )
                    results.append(result)
                per_message = [r["seconds"] * 1e6 / count for r in results]
                rows.append(
                    {
                        "size": size,
                        "shape": shape,
                        "level": args.level,
                        "messages": count,
                        "reads": len(chunks),
                        "deliveries": expected,
                        "bytes_sent": results[0]["bytes_sent"],
                        "us_per_message": per_message,
                        "us_per_message_min": min(per_message),
                        "us_per_message_median": statistics.median(per_message),
                        "us_per_read_median": statistics.median(
                            r["seconds"] * 1e6 / len(chunks) for r in results
                        ),
                    }
                )
    return {
        "benchmark": "mqtt_replay",
        "parameters": {
            "sizes": args.sizes,
            "messages": args.messages,
            "latency_messages": args.latency_messages,
            "level": args.level,
            "reps": args.reps,
            "seed": args.seed,
            "quick": args.quick,
        },
        "python": sys.version.split()[0],
        "rows": rows,
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        "| S | shape | messages | reads | deliveries | µs/message min | median | µs/read median |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['size']:,} | {row['shape']} | {row['messages']:,} | {row['reads']:,} | "
            f"{row['deliveries']:,} | {row['us_per_message_min']:.2f} | "
            f"{row['us_per_message_median']:.2f} | {row['us_per_read_median']:.1f} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000", help="filters, comma-separated")
    parser.add_argument("--messages", type=int, default=50_000, help="throughput shape")
    parser.add_argument("--latency-messages", type=int, default=20_000, help="latency shape")
    parser.add_argument("--level", type=int, choices=(4, 5), default=4, help="MQTT level")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the report here")
    parser.add_argument("--profile", action="store_true", help="cProfile each run")
    parser.add_argument("--quick", action="store_true", help="a smoke test: small and once")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.messages, args.latency_messages, args.reps = "1000", 2_000, 1_000, 1
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging(level=logging.WARNING)  # (each run's CONNECTs are logged at debug)
    gc.freeze()  # as ``topiary serve`` does (broker/commands.py)
    gc.set_threshold(10_000, 0, 500)
    report = run(args)
    print(table(report))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
