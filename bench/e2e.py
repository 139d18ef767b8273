"""End-to-end benchmark: publish -> broker -> deliver over loopback, each party its own process.

    python bench/e2e.py [--quick] [--json PATH] [--only NAMES] [--seed N] [--log-dir DIR]

Processes. Every scenario starts a fresh broker, ``python -m broker.cli serve --port P
--log-format json`` (P a free 127.0.0.1 port; stdout and stderr go to a log file that is
scanned for warnings, errors and tracebacks afterwards), and stops it with SIGTERM (SIGKILL
after 10 s). Subscribers and the publisher are ``multiprocessing`` processes (spawn context),
never the process that runs this script; the script only coordinates them through pipes,
asks the broker for its ``stats`` between phases and reads its RSS and CPU time from /proc.

Scenarios (payloads of 500 bytes):

- ``exact``      1 subscriber connection holding one exact filter; 1 publisher on that topic.
- ``wild-1k``    ``workload.subscriptions(1000, seed)`` over 4 subscriber connections in
                 2 processes (2 connections each); connection k holds entries ``k::4`` (a
                 quarter each, round-robin, so the platform-wide filters such as
                 ``beacon/#`` land on different connections), each SUB with its entry's
                 dialect. The publisher draws topics from ``workload.topics(n, seed)``. The
                 broker sends a message once per session however many of its filters match,
                 so a delivery is one MSG on one connection; ``deliv/pub`` is the mean number
                 of connections a message reached.
- ``wild-10k``   the same with 10,000 subscriptions.
- ``fanout-50``  one topic, 50 subscriber connections in 5 processes (10 each), 1 publisher.
- ``subscribe-50k``  one raw connection (``broker.wire.connection.Connection``) sends 50,000
                 distinct SUB frames (workload filters, deduplicated) as one pipelined
                 buffer after HELLO/WELCOME; the time from the first byte sent to the last
                 SUBACK, then the same for 50,000 UNSUBs.
- ``durable-confirm``  the broker runs with ``--data-dir`` (a fresh temporary directory per
                 durable scenario, removed afterwards). One durable subscriber connection
                 (client id ``bench-durable``, filter ``bench/durable/>``) reads and acks
                 cumulatively every 100 messages; one publisher process runs 128 trio tasks
                 on one connection, each awaiting its own ``publish(..., confirm=True)`` in a
                 loop for 5 s (so up to 128 confirmed publishes are in flight: the broker's
                 group commit can put them in one SQLite transaction). confirmed/s = PUBACKs
                 received / (start -> the last task's last PUBACK); confirm latency = from
                 the ``publish`` call to its return, p50 / p99 / max over all of them. The
                 subscriber must receive every confirmed message, in seq order from 1.
- ``durable-batch``  the same, but the publisher pipelines: 2 tasks on one connection, each
                 looping ``client.publish_confirmed`` of 64 messages (as the Kafka bridge
                 publishes), so the same 128 confirms are in flight at most. Latency is per
                 batch. An extra row, not the goal's workload: it shows what the broker
                 confirms when the publisher does not spend a task switch per confirm.
- ``durable-replay``  the durable subscriber connects once (the session is created and its
                 filter stored) and disconnects; the publisher publishes 100,000 messages
                 without confirm, then one with ``confirm=True`` (the barrier: the store
                 commits in order, so everything before it is stored when it returns). The
                 subscriber reconnects (durable, SUBs the same filter again) and the time
                 from starting the reconnect to the last of the 100,000 stored messages gives
                 replayed messages/s; they must arrive in seq order 1, 2, ... without gaps.
                 Also recorded: the rate at which the 100,000 were stored while it was away
                 (first publish -> the barrier's PUBACK) and the time to the first MSG.
                 Both durable scenarios record the broker's ``stats`` deltas
                 (``messages_replayed``, ``store_errors``, error counters), its CPU, what the
                 store holds after the broker stopped (every delivery should be acked) and
                 the data dir's file system (fsync cost differs a lot between them).

Every subscriber connection also subscribes to ``bench/control/done``. Each publish scenario
has two phases:

a. throughput: the publisher (``broker.client``, ``publish`` without confirm) publishes as
   fast as it can, up to 200,000 messages or 5 s, then the marker ``done:a:0`` on the
   control topic with ``confirm=True`` (the barrier). published/s = messages / (first
   publish -> the barrier's PUBACK). The broker keeps each session's order, so a subscriber
   that sees the marker has seen every message before it that was not dropped. The outbound
   queue is bounded (it drops when full), so the marker can be dropped too: the publisher
   repeats it (``done:a:1``, ...) every 100 ms until every subscriber has reported; a
   subscriber stops counting at the first marker it sees (``done_index`` > 0 in the JSON
   means marker 0 was dropped for that connection). delivered/s = MSGs received by all
   subscriber connections / (first publish -> last connection's marker).
b. latency: 2,000 msg/s for 2.5 s, paced to an absolute schedule with ``trio.sleep_until``;
   the first 8 bytes of each payload are the publisher's ``time.monotonic_ns()``
   (CLOCK_MONOTONIC is system-wide on Linux); a subscriber takes the time when the read that
   brought the MSG returned. p50 / p99 / max over all deliveries.

Subscribers read with a lean parser (length prefix + ``msgpack.unpackb``) rather than the
full client, so that their CPU cost (which competes with the broker's on a small machine)
stays low; they handle connections of one process as trio tasks. The durable subscriber
does the same with raw frames (HELLO with ``durable`` and its client id, SUB, ACK): it
checks every MSG's seq (first 1, then +1 each) and acks as ``client.ack`` would.

Per scenario: broker RSS (VmRSS, and VmHWM, at the end), broker ``stats`` deltas per phase
(messages in/out, dropped, slow-consumer disconnects), broker CPU utilisation per phase
(utime + stime from /proc over wall time), the expected number of deliveries (the same
topics matched against each connection's filters with ``routing.SubscriptionTable``) and
the missing ones (expected - received; should equal the broker's dropped count).

Every party shares the machine: on 2 cores the publisher and subscribers compete with the
broker for CPU, and another benchmark running at the same time shows up as noise (the load
average at start and end is printed and recorded). The goals are checked for information
only: delivered/s >= 75,000 for wild-1k, p99 < 2 ms at 2,000 msg/s, 50,000 subscribes < 1 s,
>= 20,000 confirmed publishes/s (durable-confirm), >= 50,000 replayed messages/s
(durable-replay).

``--quick`` uses tiny counts (a CI smoke test, well under 20 s; durable-replay stores
10,000). The exit status is 0 unless
a scenario failed to run (a worker error, a timeout, a broker that did not start).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import sqlite3
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from multiprocessing.connection import Connection as Pipe
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # bench/ is a plain directory at the repository root
    sys.path.insert(0, str(ROOT))

import msgpack  # noqa: E402
import trio  # noqa: E402

from bench import workload  # noqa: E402
from bench.harness import BenchError  # noqa: E402
from bench.harness.logs import broker_notes, scan_log  # noqa: E402
from bench.harness.processes import (  # noqa: E402
    HOST,
    BrokerProcess,
    broker_stats,
    start_broker,
    stop_broker,
)
from bench.harness.procfs import cpu_seconds, cpu_times, proc_status  # noqa: E402
from bench.harness.report import (  # noqa: E402
    Goals,
    arg_parser,
    file_system,
    fmt,
    percentile,
    print_ending,
    write_report,
)
from bench.harness.report import machine_info as common_machine_info  # noqa: E402
from bench.harness.wire import KEEPALIVE, RECEIVE_SIZE, frame_bytes, open_raw, pipelined  # noqa: E402
from bench.harness.workers import Worker  # noqa: E402
from broker.client import BrokerError, connect  # noqa: E402
from broker.wire.connection import (  # noqa: E402
    Connection,
)
from broker.wire.frames import (  # noqa: E402
    PROTOCOL_VERSION,
    Ack,
    Hello,
    Pong,
    Sub,
    SubAck,
    Unsub,
    UnsubAck,
)
from routing import NATIVE, SubscriptionTable  # noqa: E402

PAYLOAD_SIZE = 500
CONTROL_TOPIC = "bench/control/done"
EXACT_TOPIC = "bench/exact/orders"
FANOUT_TOPIC = "bench/fanout/prices"
DONE_RESEND_SECONDS = 0.1
DONE_RESEND_LIMIT = 120.0  # the publisher gives up repeating the marker after this
WORKER_READY_TIMEOUT = 120.0
GOAL_DELIVERED = 75_000
GOAL_P99_MS = 2.0
GOAL_SUBSCRIBE_SECONDS = 1.0
GOAL_SUBSCRIBE_COUNT = 50_000
GOAL_CONFIRMED = 20_000  # confirmed publishes/s, durable-confirm
GOAL_REPLAY = 50_000  # replayed messages/s, durable-replay
GOAL_REPLAY_COUNT = 100_000

DURABLE_CLIENT_ID = "bench-durable"
DURABLE_FILTER = "bench/durable/>"
DURABLE_TOPIC = "bench/durable/data"
DURABLE_DONE_TOPIC = "bench/durable/done"  # matches DURABLE_FILTER: stored and sent in order
DURABLE_ACK_EVERY = 100  # the durable subscriber acks cumulatively every this many messages
DETACH_TIMEOUT = 10.0

PUBLISH_SCENARIOS = ("exact", "wild-1k", "wild-10k", "fanout-50")
SUBSCRIBE_SCENARIO = "subscribe-50k"
DURABLE_CONFIRM = "durable-confirm"
DURABLE_BATCH = "durable-batch"
DURABLE_REPLAY = "durable-replay"
DURABLE_SCENARIOS = (DURABLE_CONFIRM, DURABLE_BATCH, DURABLE_REPLAY)
CONFIRM_SCENARIOS = (DURABLE_CONFIRM, DURABLE_BATCH)
ALL_SCENARIOS = (*PUBLISH_SCENARIOS, SUBSCRIBE_SCENARIO, *DURABLE_SCENARIOS)

FULL: dict[str, Any] = {
    "throughput_max": 200_000,
    "throughput_seconds": 5.0,
    "latency_rate": 2_000,
    "latency_seconds": 2.5,
    "wild_connections": 4,
    "wild_processes": 2,
    "fanout_connections": 50,
    "fanout_processes": 5,
    "subscribe_count": 50_000,
    "drain_timeout": 30.0,
    "durable_tasks": 128,  # concurrent confirmed publishes (trio tasks on one connection)
    "durable_batch_tasks": 2,  # durable-batch: tasks, each looping publish_confirmed(...)
    "durable_batch_size": 64,  # messages per publish_confirmed call
    "durable_confirm_seconds": 5.0,
    "durable_replay_count": 100_000,
}
QUICK: dict[str, Any] = {
    **FULL,
    "throughput_max": 2_000,
    "throughput_seconds": 0.5,
    "latency_seconds": 0.25,
    "subscribe_count": 5_000,
    "drain_timeout": 15.0,
    "durable_confirm_seconds": 0.5,
    "durable_replay_count": 10_000,
}


# -- subscriber side (runs in worker processes) -------------------------------------------


class SubscriberConnection:
    """One subscriber connection: raw SUBs, then a lean MSG counter."""

    def __init__(self, stream: trio.SocketStream, proto: Connection) -> None:
        self.stream = stream
        self.proto = proto
        self.buffer = bytearray()
        self.subscribed = 0
        self.last_result: dict[str, Any] | None = None

    @classmethod
    async def open(cls, port: int) -> SubscriberConnection:
        return cls(*await open_raw(port))

    async def subscribe(self, filters: list[tuple[str, str]]) -> None:
        wanted = [*filters, (CONTROL_TOPIC, NATIVE)]
        frames = [Sub(id=i, filter=f, dialect=d) for i, (f, d) in enumerate(wanted, 1)]
        _, acks, errors = await pipelined(
            self.stream, self.proto, self.proto.send_many(frames), SubAck, len(frames)
        )
        if errors:
            raise BenchError(
                f"{len(errors)} SUBs refused, first: {errors[0].code} {errors[0].text}"
            )
        if self.proto.buffered:
            raise BenchError("unexpected bytes after the last SUBACK")
        self.subscribed = len(acks)

    async def count_until_done(self, phase: str, latencies: bool) -> dict[str, Any]:
        """Read MSGs until the first ``done:{phase}:k`` marker (or EOF, an ERROR, cancel)."""
        marker = f"done:{phase}:".encode()
        stream = self.stream
        buf = self.buffer
        unpack = msgpack.unpackb
        count = 0
        late = 0
        samples: list[int] = []
        done_at: int | None = None
        done_index: int | None = None
        error: str | None = None
        self.last_result = None
        try:
            while done_at is None and error is None:
                try:
                    data = await stream.receive_some(RECEIVE_SIZE)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    error = f"connection broken: {exc}"
                    break
                if not data:
                    error = "EOF: the broker closed the connection"
                    break
                now = time.monotonic_ns()
                buf += data
                pos = 0
                end_buf = len(buf)
                while end_buf - pos >= 4:
                    end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
                    if end > end_buf:
                        break
                    body = unpack(buf[pos + 4 : end])
                    pos = end
                    kind = body.get("type")
                    if kind == "MSG":
                        if body["topic"] == CONTROL_TOPIC:
                            payload = body["payload"]
                            if done_at is None and payload.startswith(marker):
                                done_at = now
                                done_index = int(payload[len(marker) :])
                        elif done_at is not None:
                            late += 1  # cannot happen: nothing is published after the marker
                        else:
                            count += 1
                            if latencies:
                                samples.append(now - int.from_bytes(body["payload"][:8], "big"))
                    elif kind == "PING":
                        await stream.send_all(self.proto.send(Pong(id=body.get("id", 0))))
                    elif kind == "ERROR":
                        error = f"ERROR {body.get('code')}: {body.get('text')}"
                del buf[:pos]
        finally:
            self.last_result = {
                "count": count,
                "done_ns": done_at,
                "done_index": done_index,
                "error": error,
                "late": late,
                "latencies_ns": samples,
            }
        return self.last_result

    async def aclose(self) -> None:
        await trio.aclose_forcefully(self.stream)


async def _count_into(
    results: list[dict[str, Any] | None], index: int, conn: SubscriberConnection, phase: str
) -> None:
    results[index] = await conn.count_until_done(phase, latencies=phase == "b")


async def subscriber_main(pipe: Pipe, port: int, connections: list[list[tuple[str, str]]]) -> None:
    conns: list[SubscriberConnection] = []
    try:
        for _ in connections:
            conns.append(await SubscriberConnection.open(port))
        async with trio.open_nursery() as nursery:
            for conn, filters in zip(conns, connections, strict=True):
                nursery.start_soon(conn.subscribe, filters)
        pipe.send(("ready", {"subscribed": [c.subscribed for c in conns], "pid": os.getpid()}))
        while True:
            command = await trio.to_thread.run_sync(pipe.recv)
            if command[0] == "stop":
                return
            _, phase, timeout = command
            cpu = time.process_time()
            results: list[dict[str, Any] | None] = [None] * len(conns)
            pipe.send(("armed",))
            with trio.move_on_after(timeout):
                async with trio.open_nursery() as nursery:
                    for index, conn in enumerate(conns):
                        nursery.start_soon(_count_into, results, index, conn, phase)
            for index, result in enumerate(results):
                if result is None:  # cancelled before it returned: a timeout
                    partial = conns[index].last_result or {"count": 0, "late": 0}
                    results[index] = {
                        **partial,
                        "done_ns": None,
                        "done_index": None,
                        "error": f"no done marker within {timeout:g} s",
                        "latencies_ns": partial.get("latencies_ns", []),
                    }
            pipe.send(("result", results, time.process_time() - cpu))
    finally:
        for conn in conns:
            await conn.aclose()


# -- publisher side (runs in a worker process) --------------------------------------------


def _publisher_topics(spec: tuple[str, Any], seed: int) -> list[str]:
    kind, value = spec
    return workload.topics(value, seed) if kind == "wild" else [value]


async def _publish_throughput(
    client: Any, topics: list[str], payload: bytes, limit: int, seconds: float
) -> dict[str, Any]:
    publish = client.publish
    n_topics = len(topics)
    sent = 0
    first = time.monotonic_ns()
    deadline = first + int(seconds * 1e9)
    while sent < limit:
        await publish(topics[sent % n_topics], payload)
        sent += 1
        if not sent & 255 and time.monotonic_ns() >= deadline:
            break
    last = time.monotonic_ns()
    await publish(CONTROL_TOPIC, b"done:a:0", confirm=True)
    barrier = time.monotonic_ns()
    return {"sent": sent, "first_ns": first, "last_ns": last, "barrier_ns": barrier}


async def _publish_paced(
    client: Any, topics: list[str], payload: bytes, rate: int, seconds: float
) -> dict[str, Any]:
    publish = client.publish
    n_topics = len(topics)
    total = max(1, round(rate * seconds))
    filler = payload[8:]
    worst_lag = 0.0
    start = trio.current_time() + 0.01
    first = time.monotonic_ns()
    for i in range(total):
        due = start + i / rate
        now = trio.current_time()
        if now < due:
            await trio.sleep_until(due)
        else:
            worst_lag = max(worst_lag, now - due)
        await publish(topics[i % n_topics], time.monotonic_ns().to_bytes(8, "big") + filler)
    last = time.monotonic_ns()
    await publish(CONTROL_TOPIC, b"done:b:0", confirm=True)
    barrier = time.monotonic_ns()
    return {
        "sent": total,
        "first_ns": first,
        "last_ns": last,
        "barrier_ns": barrier,
        "achieved_rate": total / max((last - first) / 1e9, 1e-9),
        "worst_lag_ms": worst_lag * 1000,
    }


async def publisher_main(pipe: Pipe, port: int, spec: tuple[str, Any], seed: int) -> None:
    topics = _publisher_topics(spec, seed)
    payload = bytes(range(256)) * (PAYLOAD_SIZE // 256) + bytes(PAYLOAD_SIZE % 256)
    async with connect((HOST, port), keepalive=KEEPALIVE) as client:
        pipe.send(("ready", {"topics": len(topics), "pid": os.getpid()}))
        while True:
            command = await trio.to_thread.run_sync(pipe.recv)
            if command[0] == "stop":
                return
            cpu = time.process_time()
            if command[0] == "throughput":
                phase = "a"
                info = await _publish_throughput(client, topics, payload, *command[1:])
            else:
                phase = "b"
                info = await _publish_paced(client, topics, payload, *command[1:])
            info["cpu_seconds"] = time.process_time() - cpu
            pipe.send(("published", info))
            # Repeat the marker until every subscriber has it (it may have been dropped).
            resent = 0
            give_up = trio.current_time() + DONE_RESEND_LIMIT
            while not pipe.poll() and trio.current_time() < give_up:
                await trio.sleep(DONE_RESEND_SECONDS)
                resent += 1
                await client.publish(CONTROL_TOPIC, f"done:{phase}:{resent}".encode(), confirm=True)
            await trio.to_thread.run_sync(pipe.recv)  # "enough"
            pipe.send(("stopped", {"markers_resent": resent}))


# -- durable scenarios: subscriber and publisher (worker processes) -----------------------


def _bench_payload() -> bytes:
    return bytes(range(256)) * (PAYLOAD_SIZE // 256) + bytes(PAYLOAD_SIZE % 256)


class DurableSubscriber:
    """The durable subscriber ``bench-durable``: raw HELLO / SUB / ACK, a lean MSG reader.

    It checks that MSGs come in seq order without gaps (``seq`` of the first one, then +1
    each) and acks cumulatively every ``DURABLE_ACK_EVERY`` messages, and at the marker.
    """

    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: trio.SocketStream | None = None
        self.buffer = bytearray()
        self.read_ns = 0
        self.session_present: bool | None = None
        self.suback = False
        self.unacked = 0
        self.last_acked = 0
        self.acks_sent = 0
        self.prev_seq: int | None = None
        self.result: dict[str, Any] = {}

    async def connect(self) -> None:
        """TCP, HELLO (durable) -> WELCOME, SUB; the SUBACK (and any replay) come in ``pump``."""
        self.stream = stream = await trio.open_tcp_stream(HOST, self.port)
        self.buffer = bytearray()
        self.suback = False
        hello = Hello(
            version=PROTOCOL_VERSION,
            client_id=DURABLE_CLIENT_ID,
            durable=True,
            keepalive=KEEPALIVE,
        )
        await stream.send_all(frame_bytes(hello))
        while True:
            buf = self.buffer
            if len(buf) >= 4:
                end = 4 + int.from_bytes(buf[:4], "big")
                if len(buf) >= end:
                    body = msgpack.unpackb(buf[4:end])
                    del buf[:end]  # what follows WELCOME (a replay) stays for pump()
                    break
            data = await stream.receive_some(RECEIVE_SIZE)
            if not data:
                raise BenchError("the broker closed the connection during the handshake")
            self.read_ns = time.monotonic_ns()
            buf += data
        if body.get("type") != "WELCOME":
            raise BenchError(f"expected WELCOME, got {body!r}")
        self.session_present = bool(body.get("session_present"))
        await stream.send_all(frame_bytes(Sub(id=1, filter=DURABLE_FILTER, dialect=NATIVE)))

    def start_count(self) -> None:
        self.result = {
            "count": 0,
            "first_seq": None,
            "last_seq": None,
            "gaps": 0,
            "missing_seqs": 0,
            "backwards": 0,
            "first_msg_ns": None,
            "last_data_ns": None,
            "done_ns": None,
            "done_seq": None,
            "late": 0,
            "error": None,
        }
        self.prev_seq = None

    async def pump(self, until_done: bool) -> dict[str, Any]:
        """Read until the SUBACK (and, with ``until_done``, the done marker) has come."""
        stream = self.stream
        assert stream is not None
        r = self.result
        unpack = msgpack.unpackb
        buf = self.buffer
        now = self.read_ns
        while True:
            out = bytearray()
            pos = 0
            end_buf = len(buf)
            while end_buf - pos >= 4:
                end = pos + 4 + int.from_bytes(buf[pos : pos + 4], "big")
                if end > end_buf:
                    break
                body = unpack(buf[pos + 4 : end])
                pos = end
                kind = body.get("type")
                if kind == "MSG":
                    seq = body["seq"]
                    prev = self.prev_seq
                    if prev is None:
                        r["first_seq"] = seq
                        r["first_msg_ns"] = now
                    elif seq != prev + 1:
                        if seq > prev + 1:
                            r["gaps"] += 1
                            r["missing_seqs"] += seq - prev - 1
                        else:
                            r["backwards"] += 1
                    self.prev_seq = seq
                    r["last_seq"] = seq
                    if body["topic"] == DURABLE_DONE_TOPIC:
                        if r["done_ns"] is None:
                            r["done_ns"] = now
                            r["done_seq"] = seq
                    elif r["done_ns"] is not None:
                        r["late"] += 1
                    else:
                        r["count"] += 1
                        r["last_data_ns"] = now
                    self.unacked += 1
                    if self.unacked >= DURABLE_ACK_EVERY or r["done_seq"] == seq:
                        if seq > self.last_acked:
                            out += frame_bytes(Ack(seq=seq))
                            self.last_acked = seq
                            self.acks_sent += 1
                        self.unacked = 0
                elif kind == "SUBACK":
                    self.suback = True
                elif kind == "PING":
                    out += frame_bytes(Pong(id=body.get("id", 0)))
                elif kind == "ERROR":
                    r["error"] = f"ERROR {body.get('code')}: {body.get('text')}"
                else:
                    r["error"] = f"unexpected {kind} frame"
            del buf[:pos]
            if out:
                await stream.send_all(bytes(out))
            if r["error"] is not None or (
                self.suback and (not until_done or r["done_ns"] is not None)
            ):
                return r
            try:
                data = await stream.receive_some(RECEIVE_SIZE)
            except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                r["error"] = f"connection broken: {exc}"
                return r
            if not data:
                r["error"] = "EOF: the broker closed the connection"
                return r
            now = self.read_ns = time.monotonic_ns()
            buf += data

    def summary(self) -> dict[str, Any]:
        return {
            **self.result,
            "session_present": self.session_present,
            "suback": self.suback,
            "acks_sent": self.acks_sent,
            "last_acked": self.last_acked,
        }

    async def aclose(self) -> None:
        if self.stream is not None:
            await trio.aclose_forcefully(self.stream)
            self.stream = None


async def durable_subscriber_main(pipe: Pipe, port: int) -> None:
    sub = DurableSubscriber(port)
    try:
        sub.start_count()
        with trio.fail_after(30):
            await sub.connect()
            await sub.pump(until_done=False)
        if sub.result["error"]:
            raise BenchError(sub.result["error"])
        pipe.send(("ready", {"session_present": sub.session_present, "pid": os.getpid()}))
        while True:
            command = await trio.to_thread.run_sync(pipe.recv)
            if command[0] == "stop":
                return
            if command[0] == "disconnect":
                await sub.aclose()
                pipe.send(("away", sub.summary()))
                continue
            _, timeout = command
            cpu = time.process_time()
            sub.start_count()
            started = time.monotonic_ns()
            if command[0] == "count":  # the publisher starts when we say "armed"
                pipe.send(("armed",))
                with trio.move_on_after(timeout):
                    await sub.pump(until_done=True)
            else:  # "reconnect": the replay
                with trio.move_on_after(timeout):
                    await sub.connect()
                    await sub.pump(until_done=True)
            result = sub.summary()
            if result["done_ns"] is None and result["error"] is None:
                result["error"] = f"no done marker within {timeout:g} s"
            result["started_ns"] = started
            result["cpu_seconds"] = time.process_time() - cpu
            pipe.send(("result", result))
    finally:
        await sub.aclose()


def _ms_summary(samples_ns: list[int]) -> dict[str, float] | None:
    if not samples_ns:
        return None
    ordered = sorted(samples_ns)
    return {
        "p50": percentile(ordered, 0.50) / 1e6,
        "p90": percentile(ordered, 0.90) / 1e6,
        "p99": percentile(ordered, 0.99) / 1e6,
        "p999": percentile(ordered, 0.999) / 1e6,
        "max": ordered[-1] / 1e6,
        "min": ordered[0] / 1e6,
        "mean": sum(ordered) / len(ordered) / 1e6,
    }


async def _publish_confirmed(
    client: Any, payload: bytes, tasks: int, seconds: float
) -> dict[str, Any]:
    """``tasks`` tasks, each publishing with confirm=True in a loop until the deadline."""
    latencies: list[int] = []
    errors: list[str] = []
    per_task = [0] * tasks
    first = time.monotonic_ns()
    deadline = first + int(seconds * 1e9)

    async def one(index: int) -> None:
        publish = client.publish
        clock = time.monotonic_ns
        record = latencies.append
        done = 0
        while (started := clock()) < deadline:
            try:
                await publish(DURABLE_TOPIC, payload, confirm=True)
            except BrokerError as exc:
                errors.append(str(exc))
                continue
            record(clock() - started)
            done += 1
        per_task[index] = done

    async with trio.open_nursery() as nursery:
        for index in range(tasks):
            nursery.start_soon(one, index)
    last = time.monotonic_ns()
    await client.publish(DURABLE_DONE_TOPIC, b"done", confirm=True)
    return {
        "tasks": tasks,
        "confirmed": len(latencies),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "first_ns": first,
        "last_ns": last,
        "per_task_min": min(per_task),
        "per_task_max": max(per_task),
        "latency_ms": _ms_summary(latencies),
    }


async def _publish_confirmed_batches(
    client: Any, payload: bytes, tasks: int, size: int, seconds: float
) -> dict[str, Any]:
    """``tasks`` tasks, each calling ``publish_confirmed`` with ``size`` messages in a loop
    until the deadline; latency is per batch (call to return)."""
    latencies: list[int] = []
    errors: list[str] = []
    per_task = [0] * tasks
    batch = [(DURABLE_TOPIC, payload, None)] * size
    first = time.monotonic_ns()
    deadline = first + int(seconds * 1e9)

    async def one(index: int) -> None:
        clock = time.monotonic_ns
        done = 0
        while (started := clock()) < deadline:
            refused = [e for e in await client.publish_confirmed(batch) if e is not None]
            latencies.append(clock() - started)
            errors.extend(str(e) for e in refused)
            done += size - len(refused)
        per_task[index] = done

    async with trio.open_nursery() as nursery:
        for index in range(tasks):
            nursery.start_soon(one, index)
    last = time.monotonic_ns()
    await client.publish(DURABLE_DONE_TOPIC, b"done", confirm=True)
    return {
        "tasks": tasks,
        "batch_size": size,
        "confirmed": sum(per_task),
        "errors": len(errors),
        "first_error": errors[0] if errors else None,
        "first_ns": first,
        "last_ns": last,
        "per_task_min": min(per_task),
        "per_task_max": max(per_task),
        "latency_ms": _ms_summary(latencies),
    }


async def _publish_fill(client: Any, payload: bytes, count: int) -> dict[str, Any]:
    """``count`` publishes without confirm, then the marker with confirm (the barrier)."""
    publish = client.publish
    first = time.monotonic_ns()
    for _ in range(count):
        await publish(DURABLE_TOPIC, payload)
    last = time.monotonic_ns()
    await publish(DURABLE_DONE_TOPIC, b"done", confirm=True)
    return {
        "sent": count,
        "first_ns": first,
        "last_ns": last,
        "barrier_ns": time.monotonic_ns(),
    }


async def durable_publisher_main(pipe: Pipe, port: int) -> None:
    payload = _bench_payload()
    async with connect((HOST, port), keepalive=KEEPALIVE) as client:
        pipe.send(("ready", {"pid": os.getpid()}))
        while True:
            command = await trio.to_thread.run_sync(pipe.recv)
            if command[0] == "stop":
                return
            cpu = time.process_time()
            if command[0] == "confirm":
                info = await _publish_confirmed(client, payload, *command[1:])
            elif command[0] == "batches":
                info = await _publish_confirmed_batches(client, payload, *command[1:])
            else:
                info = await _publish_fill(client, payload, *command[1:])
            info["cpu_seconds"] = time.process_time() - cpu
            pipe.send(("published", info))


def _profile_path(profile_dir: Path | None, name: str) -> Path | None:
    if profile_dir is None:
        return None
    profile_dir.mkdir(parents=True, exist_ok=True)
    return profile_dir / f"{name}.prof"


# -- scenarios -----------------------------------------------------------------------------


@dataclass
class Scenario:
    name: str
    publisher_topics: tuple[str, Any]  # ("wild", n) or ("fixed", topic)
    processes: list[list[list[tuple[str, str]]]]  # process -> connection -> (filter, dialect)
    subscriptions: int
    layout: str
    table: SubscriptionTable | None = None  # wildcard: subscriber = connection index
    fan_cache: dict[str, int] = field(default_factory=dict)

    @property
    def connections(self) -> int:
        return sum(len(p) for p in self.processes)

    def expected(self, topics: list[str], sent: int) -> int:
        """Deliveries (one per connection a message matches) for the first ``sent``."""
        if self.table is None:
            return sent * self.connections
        total = 0
        cache = self.fan_cache
        for i in range(sent):
            topic = topics[i % len(topics)]
            fan = cache.get(topic)
            if fan is None:
                fan = cache[topic] = len(self.table.match_uncached(topic))
            total += fan
        return total


def _split(items: list, parts: int) -> list[list]:
    return [items[k::parts] for k in range(parts)]


def build_scenario(name: str, params: dict[str, Any], seed: int) -> Scenario:
    topic_count = max(params["throughput_max"], params["latency_rate"] * 3)
    if name == "exact":
        return Scenario(
            name,
            ("fixed", EXACT_TOPIC),
            [[[(EXACT_TOPIC, NATIVE)]]],
            1,
            "1 process x 1 connection, 1 exact filter",
        )
    if name == "fanout-50":
        n, procs = params["fanout_connections"], params["fanout_processes"]
        conns = [[(FANOUT_TOPIC, NATIVE)] for _ in range(n)]
        return Scenario(
            name,
            ("fixed", FANOUT_TOPIC),
            _split(conns, procs),
            n,
            f"{procs} processes x {n // procs} connections, 1 exact filter each",
        )
    if name in ("wild-1k", "wild-10k"):
        size = 1_000 if name == "wild-1k" else 10_000
        n, procs = params["wild_connections"], params["wild_processes"]
        entries = workload.subscriptions(size, seed)
        conns = [[(f, d) for f, _, d in part] for part in _split(entries, n)]
        table = SubscriptionTable(cache_size=0)
        for index, part in enumerate(conns):
            for f, d in part:
                table.add(f, index, d)
        return Scenario(
            name,
            ("wild", topic_count),
            _split(conns, procs),
            size,
            f"{procs} processes x {n // procs} connections, workload entries k::{n} each",
            table,
        )
    raise ValueError(name)


def _phase(
    kind: str,
    sc: Scenario,
    subs: list[Worker],
    pub: Worker,
    broker: BrokerProcess,
    params: dict[str, Any],
    topics: list[str],
) -> dict[str, Any]:
    if kind == "a":
        seconds = params["throughput_seconds"]
        command: tuple = ("throughput", params["throughput_max"], seconds)
    else:
        seconds = params["latency_seconds"]
        command = ("latency", params["latency_rate"], seconds)
    timeout = seconds + params["drain_timeout"]
    stats_before = broker_stats(broker.port)
    (user_before, sys_before), wall_before = cpu_times(broker.pid), time.monotonic()
    for worker in subs:
        worker.send(("phase", kind, timeout))
    for worker in subs:
        worker.expect("armed", 30)
    pub.send(command)
    published = pub.expect("published", timeout + 30)[1]
    conns: list[dict[str, Any]] = []
    sub_cpu = 0.0
    for worker in subs:
        _, results, cpu = worker.expect("result", timeout + 30)
        conns.extend(results)
        sub_cpu += cpu
    (user_after, sys_after), wall_after = cpu_times(broker.pid), time.monotonic()
    broker_cpu = user_after + sys_after - user_before - sys_before
    pub.send(("enough",))
    resent = pub.expect("stopped", 30)[1]["markers_resent"]
    stats_after = broker_stats(broker.port)

    def delta(key: str) -> int:
        return int(stats_after.get(key, 0)) - int(stats_before.get(key, 0))

    sent = published["sent"]
    received = sum(c["count"] or 0 for c in conns)
    expected = sc.expected(topics, sent)
    done = [c["done_ns"] for c in conns if c["done_ns"] is not None]
    complete = len(done) == len(conns)
    first = published["first_ns"]
    out: dict[str, Any] = {
        "published": sent,
        "published_per_second": sent / max((published["barrier_ns"] - first) / 1e9, 1e-9),
        "received": received,
        "expected": expected,
        "missing": expected - received,
        "complete": complete,
        "delivered_per_second": (
            received / max((max(done) - first) / 1e9, 1e-9) if done and received else None
        ),
        "seconds_to_last_marker": (max(done) - first) / 1e9 if done else None,
        "first_publish_ns": first,  # CLOCK_MONOTONIC, comparable across processes
        "dropped": delta("dropped"),
        "messages_in": delta("messages_in"),
        "messages_out": delta("messages_out"),
        "slow_consumer_disconnects": delta("slow_consumer_disconnects"),
        "broker_errors": {
            k: v - stats_before.get("errors", {}).get(k, 0)
            for k, v in stats_after.get("errors", {}).items()
            if v != stats_before.get("errors", {}).get(k, 0)
        },
        "broker_queued_after": stats_after.get("queued"),
        "broker_cpu_utilisation": broker_cpu / max(wall_after - wall_before, 1e-9),
        "broker_cpu_system_share": (sys_after - sys_before) / broker_cpu if broker_cpu else None,
        "phase_wall_seconds": wall_after - wall_before,
        "publisher_cpu_seconds": published["cpu_seconds"],
        "subscriber_cpu_seconds": sub_cpu,
        "markers_resent": resent,
        "marker_dropped_connections": sum(1 for c in conns if (c["done_index"] or 0) > 0),
        "connection_errors": [c["error"] for c in conns if c["error"]],
        "late_messages": sum(c["late"] for c in conns),
        "per_connection_received": [c["count"] for c in conns],
    }
    if received:
        out["deliveries_per_message"] = received / sent if sent else None
    if kind == "b":
        samples = sorted(s for c in conns for s in c["latencies_ns"])
        out["achieved_rate"] = published["achieved_rate"]
        out["publisher_worst_lag_ms"] = published["worst_lag_ms"]
        out["latency_samples"] = len(samples)
        if samples:
            out["latency_ms"] = {
                "p50": percentile(samples, 0.50) / 1e6,
                "p90": percentile(samples, 0.90) / 1e6,
                "p99": percentile(samples, 0.99) / 1e6,
                "p999": percentile(samples, 0.999) / 1e6,
                "max": samples[-1] / 1e6,
                "min": samples[0] / 1e6,
            }
    return out


def run_publish_scenario(
    name: str,
    params: dict[str, Any],
    seed: int,
    ctx: Any,
    log_dir: Path,
    profile_dir: Path | None = None,
    *,
    config: Path | None = None,
    alongside: Callable[[BrokerProcess], AbstractContextManager[dict[str, Any]]] | None = None,
    log_name: str | None = None,
) -> dict[str, Any]:
    """One publish scenario on a fresh broker (settings from ``config`` if given). With
    ``alongside``, its context runs from the broker's start to the end of the phases and
    what it yields (filled in as it ends) is the result's "alongside"."""
    sc = build_scenario(name, params, seed)
    topics = _publisher_topics(sc.publisher_topics, seed)
    result: dict[str, Any] = {
        "name": name,
        "subscriptions": sc.subscriptions,
        "connections": sc.connections,
        "subscriber_processes": len(sc.processes),
        "layout": sc.layout,
        "publisher_topics": len(topics),
    }
    broker: BrokerProcess | None = None
    workers: list[Worker] = []
    started = time.monotonic()
    beside = contextlib.ExitStack()
    try:
        broker = start_broker(
            log_dir / f"{log_name or name}.log", _profile_path(profile_dir, name), config=config
        )
        result["broker_pid"] = broker.pid
        result["broker_log"] = str(broker.log_path)
        if alongside is not None:
            result["alongside"] = beside.enter_context(alongside(broker))
        subs = [
            Worker(ctx, subscriber_main, (broker.port, conns), f"{name}-sub{i}")
            for i, conns in enumerate(sc.processes)
        ]
        workers.extend(subs)
        pub = Worker(ctx, publisher_main, (broker.port, sc.publisher_topics, seed), f"{name}-pub")
        workers.append(pub)
        result["worker_pids"] = [w.pid for w in workers]
        ready = [w.expect("ready", WORKER_READY_TIMEOUT)[1] for w in workers]
        result["subscribed"] = sum(sum(r["subscribed"]) for r in ready[:-1])
        result["setup_seconds"] = time.monotonic() - started
        result["throughput"] = _phase("a", sc, subs, pub, broker, params, topics)
        result["latency"] = _phase("b", sc, subs, pub, broker, params, topics)
        beside.close()
        status = proc_status(broker.pid)
        result["broker_rss_mb"] = status.get("VmRSS")
        result["broker_hwm_mb"] = status.get("VmHWM")
        result["broker_stats"] = broker_stats(broker.port)
    except (BenchError, OSError, trio.TooSlowError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            beside.close()
        finally:
            for worker in workers:
                worker.stop()
            if broker is not None:
                result["broker_stop"] = stop_broker(broker)
                result["broker_log_summary"] = scan_log(broker.log_path)
    result["seconds"] = time.monotonic() - started
    return result


def subscribe_filters(count: int, seed: int) -> list[tuple[str, str]]:
    """``count`` distinct (filter, dialect) pairs shaped like the workload."""
    found: dict[tuple[str, str], None] = {}
    for text, _, dialect in workload.subscriptions(count + count // 4, seed):
        found.setdefault((text, dialect))
        if len(found) == count:
            break
    extra = 0
    while len(found) < count:
        found.setdefault((f"bench/extra/{extra}/>", NATIVE))
        extra += 1
    return list(found)


async def _subscribe_run(port: int, filters: list[tuple[str, str]]) -> dict[str, Any]:
    with trio.fail_after(120):
        stream, proto = await open_raw(port)
        try:
            started = time.perf_counter()
            frames = [Sub(id=i, filter=f, dialect=d) for i, (f, d) in enumerate(filters, 1)]
            data = proto.send_many(frames)
            encode = time.perf_counter() - started
            sub_seconds, acks, sub_errors = await pipelined(
                stream, proto, data, SubAck, len(frames)
            )
            base = len(frames) + 1
            unsubs = [Unsub(id=base + i, sub=ack.sub) for i, ack in enumerate(acks)]  # type: ignore[attr-defined]
            data = proto.send_many(unsubs)
            unsub_seconds, unacks, unsub_errors = await pipelined(
                stream, proto, data, UnsubAck, len(unsubs)
            )
        finally:
            await trio.aclose_forcefully(stream)
    return {
        "count": len(frames),
        "bytes": len(data),
        "client_encode_seconds": encode,
        "subscribe_seconds": sub_seconds,
        "subscribes_per_second": len(acks) / sub_seconds,
        "subscribe_errors": len(sub_errors),
        "unsubscribe_seconds": unsub_seconds,
        "unsubscribes_per_second": len(unacks) / unsub_seconds if unsub_seconds else None,
        "unsubscribe_errors": len(unsub_errors),
        "first_error": str((sub_errors or unsub_errors)[0]) if sub_errors or unsub_errors else None,
    }


def run_subscribe_scenario(
    params: dict[str, Any], seed: int, log_dir: Path, profile_dir: Path | None = None
) -> dict[str, Any]:
    count = params["subscribe_count"]
    filters = subscribe_filters(count, seed)
    result: dict[str, Any] = {"name": SUBSCRIBE_SCENARIO, "count": count}
    broker: BrokerProcess | None = None
    started = time.monotonic()
    try:
        broker = start_broker(
            log_dir / f"{SUBSCRIBE_SCENARIO}.log", _profile_path(profile_dir, SUBSCRIBE_SCENARIO)
        )
        result["broker_pid"] = broker.pid
        result["broker_log"] = str(broker.log_path)
        # The broker holds subscriptions of its own (the bridge reports' store): the storm's
        # entries must all be gone afterwards, down to what was there before it.
        result["table_entries_before"] = broker_stats(broker.port).get("table", {}).get("entries")
        cpu_before = cpu_seconds(broker.pid)
        result.update(trio.run(_subscribe_run, broker.port, filters))
        result["broker_cpu_seconds"] = cpu_seconds(broker.pid) - cpu_before
        stats = broker_stats(broker.port)
        result["broker_subscribes"] = stats.get("subscribes")
        result["broker_unsubscribes"] = stats.get("unsubscribes")
        result["table_entries_after"] = stats.get("table", {}).get("entries")
        status = proc_status(broker.pid)
        result["broker_rss_mb"] = status.get("VmRSS")
        result["broker_hwm_mb"] = status.get("VmHWM")
    except (BenchError, OSError, trio.TooSlowError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if broker is not None:
            result["broker_stop"] = stop_broker(broker)
            result["broker_log_summary"] = scan_log(broker.log_path)
    result["seconds"] = time.monotonic() - started
    return result


def directory_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def store_contents(data_dir: Path) -> dict[str, Any]:
    """What the (stopped) broker left in its store: rows per table, the session's positions."""
    db_path = data_dir / "topiary.db"
    if not db_path.exists():
        return {"error": "no topiary.db"}
    try:
        with contextlib.closing(sqlite3.connect(db_path)) as db:
            out: dict[str, Any] = {
                table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                for table in ("messages", "deliveries", "sessions", "filters")
            }
            row = db.execute(
                "SELECT last_ack, next_seq FROM sessions WHERE client_id = ?",
                (DURABLE_CLIENT_ID,),
            ).fetchone()
            out["last_ack"], out["next_seq"] = row if row is not None else (None, None)
            return out
    except sqlite3.Error as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}


def wait_detached(port: int, timeout: float) -> bool:
    """Wait until the broker holds no connection but the one asking (the session detached)."""
    deadline = time.monotonic() + timeout
    while True:
        if broker_stats(port).get("connections") == 1:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


def _stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "messages_in", "messages_out", "messages_replayed", "store_errors", "dropped",
        "duplicates_dropped", "slow_consumer_disconnects", "idle_disconnects", "bytes_sent",
    )  # fmt: skip
    out: dict[str, Any] = {k: int(after.get(k, 0)) - int(before.get(k, 0)) for k in keys}
    errors_before = before.get("errors", {})
    out["errors"] = {
        k: v - errors_before.get(k, 0)
        for k, v in after.get("errors", {}).items()
        if v != errors_before.get(k, 0)
    }
    return out


def _in_order(got: dict[str, Any], first_seq: int) -> bool:
    return (
        got["first_seq"] == first_seq
        and got["gaps"] == 0
        and got["backwards"] == 0
        and got["late"] == 0
        and got["done_seq"] == got["last_seq"]
    )


def _durable_confirm(
    params: dict[str, Any],
    ctx: Any,
    broker: BrokerProcess,
    sub: Worker,
    result: dict[str, Any],
    name: str = DURABLE_CONFIRM,
) -> None:
    seconds = params["durable_confirm_seconds"]
    timeout = seconds + params["drain_timeout"]
    if name == DURABLE_BATCH:
        command: tuple = (
            "batches", params["durable_batch_tasks"], params["durable_batch_size"], seconds
        )  # fmt: skip
    else:
        command = ("confirm", params["durable_tasks"], seconds)
    pub = Worker(ctx, durable_publisher_main, (broker.port,), f"{name}-pub")
    result["worker_pids"].append(pub.pid)
    try:
        pub.expect("ready", WORKER_READY_TIMEOUT)
        stats_before = broker_stats(broker.port)
        (user0, sys0), wall0 = cpu_times(broker.pid), time.monotonic()
        sub.send(("count", timeout))
        sub.expect("armed", 30)
        pub.send(command)
        published = pub.expect("published", timeout + 30)[1]
        got = sub.expect("result", timeout + 30)[1]
        (user1, sys1), wall1 = cpu_times(broker.pid), time.monotonic()
        stats_after = broker_stats(broker.port)
    finally:
        pub.stop()
    broker_cpu = user1 + sys1 - user0 - sys0
    confirmed = published["confirmed"]
    attempted = confirmed + published["errors"]
    window = max((published["last_ns"] - published["first_ns"]) / 1e9, 1e-9)
    result.update(
        {
            "tasks": published["tasks"],
            "batch_size": published.get("batch_size"),
            "publish_seconds": seconds,
            "confirmed": confirmed,
            "publish_errors": published["errors"],
            "first_publish_error": published["first_error"],
            "confirmed_per_second": confirmed / window,
            "confirm_window_seconds": window,
            "confirm_latency_ms": published["latency_ms"],
            "per_task_confirmed": [published["per_task_min"], published["per_task_max"]],
            "received": got["count"],
            "missing": confirmed - got["count"],
            "unexpected": max(0, got["count"] - attempted),
            "in_order": _in_order(got, 1),
            "subscriber": got,
            "seconds_to_marker": (
                (got["done_ns"] - published["first_ns"]) / 1e9 if got["done_ns"] else None
            ),
            "broker": _stats_delta(stats_before, stats_after),
            "broker_cpu_utilisation": broker_cpu / max(wall1 - wall0, 1e-9),
            "broker_cpu_system_share": (sys1 - sys0) / broker_cpu if broker_cpu else None,
            "phase_wall_seconds": wall1 - wall0,
            "publisher_cpu_seconds": published["cpu_seconds"],
            "subscriber_cpu_seconds": got["cpu_seconds"],
        }
    )


def _durable_replay(
    params: dict[str, Any], ctx: Any, broker: BrokerProcess, sub: Worker, result: dict[str, Any]
) -> None:
    count = params["durable_replay_count"]
    timeout = params["drain_timeout"] + count / 10_000
    sub.send(("disconnect",))
    sub.expect("away", 30)
    result["detached"] = wait_detached(broker.port, DETACH_TIMEOUT)
    pub = Worker(ctx, durable_publisher_main, (broker.port,), f"{DURABLE_REPLAY}-pub")
    result["worker_pids"].append(pub.pid)
    try:
        pub.expect("ready", WORKER_READY_TIMEOUT)
        stats0 = broker_stats(broker.port)
        (user0, sys0), wall0 = cpu_times(broker.pid), time.monotonic()
        pub.send(("fill", count))
        filled = pub.expect("published", timeout + 30)[1]
        (user1, sys1), wall1 = cpu_times(broker.pid), time.monotonic()
    finally:
        pub.stop()  # idle during the replay: out of the way
    stats1 = broker_stats(broker.port)
    result["data_dir_bytes_stored"] = directory_bytes(Path(result["data_dir"]))
    (user2, sys2), wall2 = cpu_times(broker.pid), time.monotonic()
    sub.send(("reconnect", timeout))
    got = sub.expect("result", timeout + 30)[1]
    (user3, sys3), wall3 = cpu_times(broker.pid), time.monotonic()
    stats2 = broker_stats(broker.port)
    fill_cpu = user1 + sys1 - user0 - sys0
    replay_cpu = user3 + sys3 - user2 - sys2
    started = got["started_ns"]
    replay_seconds = (got["last_data_ns"] - started) / 1e9 if got["last_data_ns"] else None
    result.update(
        {
            "count": count,
            "stored": filled["sent"],
            "fill_seconds": (filled["barrier_ns"] - filled["first_ns"]) / 1e9,
            "stored_per_second": filled["sent"]
            / max((filled["barrier_ns"] - filled["first_ns"]) / 1e9, 1e-9),
            "fill_broker": _stats_delta(stats0, stats1),
            "fill_broker_cpu_utilisation": fill_cpu / max(wall1 - wall0, 1e-9),
            "publisher_cpu_seconds": filled["cpu_seconds"],
            "received": got["count"],
            "missing": filled["sent"] - got["count"],
            "in_order": _in_order(got, 1),
            "session_present": got["session_present"],
            "replay_seconds": replay_seconds,
            "replayed_per_second": got["count"] / replay_seconds if replay_seconds else None,
            "first_message_ms": (
                (got["first_msg_ns"] - started) / 1e6 if got["first_msg_ns"] else None
            ),
            "subscriber": got,
            "broker": _stats_delta(stats1, stats2),
            "broker_cpu_utilisation": replay_cpu / max(wall3 - wall2, 1e-9),
            "broker_cpu_system_share": (sys3 - sys2) / replay_cpu if replay_cpu else None,
            "phase_wall_seconds": wall3 - wall2,
            "subscriber_cpu_seconds": got["cpu_seconds"],
        }
    )


def run_durable_scenario(
    name: str, params: dict[str, Any], ctx: Any, log_dir: Path, profile_dir: Path | None = None
) -> dict[str, Any]:
    """A broker with a fresh ``--data-dir`` (removed afterwards) and the durable subscriber."""
    result: dict[str, Any] = {"name": name, "client_id": DURABLE_CLIENT_ID, "worker_pids": []}
    broker: BrokerProcess | None = None
    sub: Worker | None = None
    started = time.monotonic()
    data_dir = Path(tempfile.mkdtemp(prefix=f"topiary-e2e-{name}-"))
    result["data_dir"] = str(data_dir)
    result["data_dir_filesystem"] = file_system(data_dir)
    try:
        broker = start_broker(log_dir / f"{name}.log", _profile_path(profile_dir, name), data_dir)
        result["broker_pid"] = broker.pid
        result["broker_log"] = str(broker.log_path)
        sub = Worker(ctx, durable_subscriber_main, (broker.port,), f"{name}-sub")
        result["worker_pids"].append(sub.pid)
        result["first_session_present"] = sub.expect("ready", WORKER_READY_TIMEOUT)[1][
            "session_present"
        ]
        result["setup_seconds"] = time.monotonic() - started
        if name in CONFIRM_SCENARIOS:
            _durable_confirm(params, ctx, broker, sub, result, name)
        else:
            _durable_replay(params, ctx, broker, sub, result)
        error = result["subscriber"]["error"]
        if error:
            result["subscriber_error"] = error
        status = proc_status(broker.pid)
        result["broker_rss_mb"] = status.get("VmRSS")
        result["broker_hwm_mb"] = status.get("VmHWM")
        result["data_dir_bytes"] = directory_bytes(data_dir)
        result["broker_stats"] = broker_stats(broker.port)
    except (BenchError, OSError, trio.TooSlowError) as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        if sub is not None:
            sub.stop()
        if broker is not None:
            result["broker_stop"] = stop_broker(broker)
            result["broker_log_summary"] = scan_log(broker.log_path)
            result["store_after_stop"] = store_contents(data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
        result["data_dir_removed"] = not data_dir.exists()
    result["seconds"] = time.monotonic() - started
    return result


# -- report --------------------------------------------------------------------------------


def table_lines(scenarios: dict[str, dict[str, Any]]) -> list[str]:
    header = (
        f"{'scenario':<11} {'subs':>6} {'conns':>5} {'published/s':>12} {'delivered/s':>12} "
        f"{'deliv/pub':>9} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} {'RSS MB':>7} "
        f"{'dropped':>16}"
    )
    lines = [header, "-" * len(header)]
    for name in PUBLISH_SCENARIOS:
        r = scenarios.get(name)
        if r is None:
            continue
        if "error" in r and "latency" not in r:
            lines.append(f"{name:<11} failed: {r['error'].splitlines()[0][:80]}")
            continue
        a, b = r["throughput"], r["latency"]
        lat = b.get("latency_ms", {})
        drops = "0"
        if a["dropped"] or b["dropped"]:
            drops = ", ".join(
                f"{d:,} {label}"
                for d, label in ((a["dropped"], "tput"), (b["dropped"], "lat"))
                if d
            )
        lines.append(
            f"{name:<11} {r['subscriptions']:>6,} {r['connections']:>5} "
            f"{fmt(a['published_per_second'], ',.0f'):>12} "
            f"{fmt(a['delivered_per_second'], ',.0f'):>12} "
            f"{fmt(a.get('deliveries_per_message'), '.2f'):>9} "
            f"{fmt(lat.get('p50'), '.2f'):>7} {fmt(lat.get('p99'), '.2f'):>7} "
            f"{fmt(lat.get('max'), '.2f'):>7} {fmt(r.get('broker_rss_mb'), '.1f'):>7} "
            f"{drops:>16}"
        )
    return lines


def subscribe_line(r: dict[str, Any]) -> str:
    if "subscribe_seconds" not in r:
        return f"{SUBSCRIBE_SCENARIO}: failed: {r.get('error', '?').splitlines()[0][:100]}"
    return (
        f"{SUBSCRIBE_SCENARIO}: {r['count']:,} SUBs pipelined: {r['subscribe_seconds']:.3f} s "
        f"to the last SUBACK ({r['subscribes_per_second']:,.0f}/s); {r['count']:,} UNSUBs: "
        f"{r['unsubscribe_seconds']:.3f} s ({r['unsubscribes_per_second']:,.0f}/s); "
        f"errors {r['subscribe_errors'] + r['unsubscribe_errors']}; "
        f"broker RSS {r['broker_rss_mb']:.1f} MB"
    )


def durable_lines(scenarios: dict[str, dict[str, Any]]) -> list[str]:
    present = [name for name in DURABLE_SCENARIOS if name in scenarios]
    if not present:
        return []
    header = (
        f"{'durable':<15} {'rate/s':>8} {'of what':<22} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'max ms':>7} {'received':>9} {'missing':>7} {'in order':>8} {'RSS MB':>7}"
    )
    lines = [header, "-" * len(header)]
    details = []
    for name in present:
        r = scenarios[name]
        if "received" not in r:
            lines.append(f"{name:<15} failed: {r.get('error', '?').splitlines()[0][:80]}")
            continue
        if name == DURABLE_BATCH:
            rate, what = r["confirmed_per_second"], "confirmed (batches)"
            lat = r["confirm_latency_ms"] or {}
            details.append(
                f"{name}: {r['tasks']} tasks x publish_confirmed({r['batch_size']} messages) "
                f"on 1 connection for {r['publish_seconds']:g} s: {r['confirmed']:,} "
                f"confirmed, {r['publish_errors']} errors; latency per batch; subscriber "
                f"acked every {DURABLE_ACK_EVERY} ({r['subscriber']['acks_sent']:,} ACKs)"
            )
        elif name == DURABLE_CONFIRM:
            rate, what = r["confirmed_per_second"], "confirmed publishes"
            lat = r["confirm_latency_ms"] or {}
            details.append(
                f"{name}: {r['tasks']} tasks x publish(confirm=True) on 1 connection for "
                f"{r['publish_seconds']:g} s: {r['confirmed']:,} PUBACKs, "
                f"{r['publish_errors']} errors; per task {r['per_task_confirmed'][0]:,}.."
                f"{r['per_task_confirmed'][1]:,}; subscriber acked every {DURABLE_ACK_EVERY} "
                f"({r['subscriber']['acks_sent']:,} ACKs)"
            )
        else:
            rate, what = r["replayed_per_second"], "replayed messages"
            lat = {}
            first = r["first_message_ms"]
            details.append(
                f"{name}: {r['stored']:,} stored while away in {r['fill_seconds']:.2f} s "
                f"({r['stored_per_second']:,.0f}/s); reconnect -> first MSG "
                f"{fmt(first, ',.1f')} ms, all in {fmt(r['replay_seconds'], '.3f')} s; "
                f"session_present {r['session_present']}; broker messages_replayed "
                f"{r['broker']['messages_replayed']:,}"
            )
        lines.append(
            f"{name:<15} {fmt(rate, ',.0f'):>8} {what:<22} {fmt(lat.get('p50'), '.2f'):>7} "
            f"{fmt(lat.get('p99'), '.2f'):>7} {fmt(lat.get('max'), '.2f'):>7} "
            f"{r['received']:>9,} {r['missing']:>7,} {'yes' if r['in_order'] else 'NO':>8} "
            f"{fmt(r.get('broker_rss_mb'), '.1f'):>7}"
        )
    fs = {scenarios[n].get("data_dir_filesystem") for n in present}
    return [
        *lines,
        *details,
        f"(store: a fresh --data-dir per scenario on {'/'.join(sorted(map(str, fs)))}; "
        "SQLite WAL, synchronous=FULL)",
    ]


def check_goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    scenarios = report["scenarios"]
    quick = report["parameters"]["quick"]
    goals = Goals()
    add = goals.add

    wild = scenarios.get("wild-1k", {}).get("throughput", {})
    value = wild.get("delivered_per_second")
    add(
        f"wild-1k delivered/s >= {GOAL_DELIVERED:,}",
        value,
        None if value is None else value >= GOAL_DELIVERED,
    )
    for name in PUBLISH_SCENARIOS:
        lat = scenarios.get(name, {}).get("latency", {}).get("latency_ms")
        p99 = None if lat is None else lat["p99"]
        add(
            f"{name} p99 < {GOAL_P99_MS:g} ms at {report['parameters']['latency_rate']:,} msg/s",
            p99,
            None if p99 is None else p99 < GOAL_P99_MS,
        )
    sub = scenarios.get(SUBSCRIBE_SCENARIO, {})
    seconds = sub.get("subscribe_seconds")
    comparable = sub.get("count") == GOAL_SUBSCRIBE_COUNT
    add(
        f"{GOAL_SUBSCRIBE_COUNT:,} subscribes < {GOAL_SUBSCRIBE_SECONDS:g} s",
        seconds,
        None if seconds is None or not comparable else seconds < GOAL_SUBSCRIBE_SECONDS,
    )
    confirm = scenarios.get(DURABLE_CONFIRM, {})
    value = confirm.get("confirmed_per_second")
    add(
        f"{DURABLE_CONFIRM} confirmed publishes/s >= {GOAL_CONFIRMED:,} "
        f"({report['parameters']['durable_tasks']} tasks)",
        value,
        None if value is None else value >= GOAL_CONFIRMED,
    )
    replay = scenarios.get(DURABLE_REPLAY, {})
    value = replay.get("replayed_per_second")
    comparable = replay.get("count") == GOAL_REPLAY_COUNT
    add(
        f"{DURABLE_REPLAY} replayed messages/s >= {GOAL_REPLAY:,} ({GOAL_REPLAY_COUNT:,} stored)",
        value,
        None if value is None or not comparable else value >= GOAL_REPLAY,
    )
    if quick:
        for goal in goals:
            goal["note"] = "quick run: counts too small to judge"
    return goals


def notes(report: dict[str, Any]) -> list[str]:
    """Anything that looks like a broker problem, one line each."""
    out: list[str] = []
    for name, r in report["scenarios"].items():
        if "error" in r:
            out.append(f"{name}: FAILED: {r['error'].splitlines()[-1][:200]}")
        for phase_key in ("throughput", "latency"):
            p = r.get(phase_key)
            if not p:
                continue
            tag = f"{name} {phase_key}"
            if p["dropped"]:
                out.append(
                    f"{tag}: broker dropped {p['dropped']:,} messages (outbound queue full); "
                    f"missing {p['missing']:,} of {p['expected']:,} expected deliveries"
                )
            elif p["missing"]:
                out.append(
                    f"{tag}: {p['missing']:,} of {p['expected']:,} expected deliveries "
                    "missing although the broker counted no drops"
                )
            if p["slow_consumer_disconnects"]:
                out.append(f"{tag}: {p['slow_consumer_disconnects']} SLOW_CONSUMER disconnects")
            if p["marker_dropped_connections"]:
                out.append(
                    f"{tag}: the done marker was dropped for "
                    f"{p['marker_dropped_connections']} connection(s) (repeated marker used)"
                )
            if p["connection_errors"]:
                out.append(f"{tag}: connection errors: {p['connection_errors'][:3]}")
            if p["broker_errors"]:
                out.append(f"{tag}: broker error counters moved: {p['broker_errors']}")
            if not p["complete"]:
                out.append(f"{tag}: not every subscriber saw the done marker")
            if p["late_messages"]:
                out.append(f"{tag}: {p['late_messages']} messages after the done marker")
        out += broker_notes(name, r)
        if name == SUBSCRIBE_SCENARIO and r.get("table_entries_after") != r.get(
            "table_entries_before"
        ):
            out.append(
                f"{name}: table holds {r['table_entries_after']} entries after UNSUBs, "
                f"{r.get('table_entries_before')} before the SUBs"
            )
        if name in DURABLE_SCENARIOS:
            out.extend(durable_notes(name, r))
    return out


def durable_notes(name: str, r: dict[str, Any]) -> list[str]:
    out: list[str] = []
    got = r.get("subscriber")
    if got is not None:
        if got["error"]:
            out.append(f"{name}: durable subscriber: {got['error']}")
        if r["missing"]:
            out.append(f"{name}: {r['missing']:,} messages missing at the durable subscriber")
        if not r["in_order"]:
            out.append(
                f"{name}: not in seq order: first seq {got['first_seq']} (expected 1), "
                f"{got['gaps']} gaps ({got['missing_seqs']} seqs skipped), {got['backwards']} "
                f"backwards, {got['late']} after the marker, marker seq {got['done_seq']} "
                f"last seq {got['last_seq']}"
            )
    if r.get("unexpected"):
        out.append(f"{name}: {r['unexpected']:,} more messages received than published")
    if r.get("publish_errors"):
        out.append(
            f"{name}: {r['publish_errors']:,} confirmed publishes refused, first: "
            f"{r['first_publish_error']}"
        )
    if r.get("first_session_present") is True:
        out.append(f"{name}: session_present was True on the first connect to a fresh store")
    if name == DURABLE_REPLAY and "session_present" in r and r["session_present"] is not True:
        out.append(f"{name}: session_present was {r['session_present']} on the reconnect")
    if r.get("detached") is False:
        out.append(f"{name}: the broker still counted the subscriber's connection after EOF")
    for key in ("fill_broker", "broker"):
        delta = r.get(key)
        if not delta:
            continue
        tag = f"{name} ({'fill' if key == 'fill_broker' else 'measured phase'})"
        if delta["store_errors"]:
            out.append(f"{tag}: broker store_errors moved by {delta['store_errors']}")
        if delta["errors"]:
            out.append(f"{tag}: broker error counters moved: {delta['errors']}")
        if delta["dropped"]:
            out.append(f"{tag}: broker dropped {delta['dropped']:,} messages")
    if r.get("data_dir_removed") is False:
        out.append(f"{name}: data dir {r['data_dir']} was not removed")
    stored = r.get("store_after_stop", {})
    if stored.get("error"):
        out.append(f"{name}: store after stop: {stored['error']}")
    elif stored.get("deliveries") and got is not None and not got["error"]:
        out.append(
            f"{name}: store still holds {stored['deliveries']:,} pending deliveries after the "
            f"final ACK of seq {got['last_acked']} (last_ack stored {stored.get('last_ack')})"
        )
    return out


def cpu_lines(report: dict[str, Any]) -> list[str]:
    lines = []
    for name in PUBLISH_SCENARIOS:
        r = report["scenarios"].get(name)
        if not r or "throughput" not in r:
            continue
        a, b = r["throughput"], r["latency"]
        lines.append(
            f"  {name:<10} throughput: broker CPU {a['broker_cpu_utilisation']:.0%} "
            f"({fmt(a['broker_cpu_system_share'], '.0%')} of it in the kernel), "
            f"publisher {a['publisher_cpu_seconds']:.1f} s, subscribers "
            f"{a['subscriber_cpu_seconds']:.1f} s over {a['phase_wall_seconds']:.1f} s; "
            f"latency: achieved {b['achieved_rate']:,.0f} msg/s, broker CPU "
            f"{b['broker_cpu_utilisation']:.0%}, {b['latency_samples']:,} samples"
        )
    for name in DURABLE_SCENARIOS:
        r = report["scenarios"].get(name)
        if not r or "received" not in r:
            continue
        line = (
            f"  {name:<10} broker CPU {r['broker_cpu_utilisation']:.0%} "
            f"({fmt(r['broker_cpu_system_share'], '.0%')} of it in the kernel) over "
            f"{r['phase_wall_seconds']:.1f} s, subscriber {r['subscriber_cpu_seconds']:.1f} s"
        )
        if name in CONFIRM_SCENARIOS:
            line += f", publisher {r['publisher_cpu_seconds']:.1f} s"
        else:
            line += (
                f"; while storing: broker CPU {r['fill_broker_cpu_utilisation']:.0%}, "
                f"publisher {r['publisher_cpu_seconds']:.1f} s"
            )
        lines.append(line)
    return lines


def machine_info() -> dict[str, Any]:
    return common_machine_info(trio=trio.__version__, msgpack=".".join(map(str, msgpack.version)))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = arg_parser(__doc__)
    parser.add_argument(
        "--only",
        default=",".join(ALL_SCENARIOS),
        help="comma-separated scenarios to run (default: all: %(default)s)",
    )
    parser.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    parser.add_argument(
        "--log-dir", help="keep the broker logs here (default: a temporary directory, removed)"
    )
    parser.add_argument(
        "--profile-broker",
        metavar="DIR",
        help="run each broker under cProfile, writing DIR/<scenario>.prof (slows the broker)",
    )
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = sorted(set(names) - set(ALL_SCENARIOS))
    if unknown or not names:
        parser.error(f"unknown scenarios {unknown}; known: {', '.join(ALL_SCENARIOS)}")
    args.names = [n for n in ALL_SCENARIOS if n in names]
    return args


def _goal_value(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}" if value < 100 else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    params = dict(QUICK if args.quick else FULL)
    ctx = multiprocessing.get_context("spawn")
    report: dict[str, Any] = {
        "benchmark": "e2e",
        "machine": machine_info(),
        "parameters": {
            **params,
            "quick": args.quick,
            "seed": args.seed,
            "payload_size": PAYLOAD_SIZE,
            "control_topic": CONTROL_TOPIC,
            "done_resend_seconds": DONE_RESEND_SECONDS,
            "scenarios": args.names,
            "broker_profiled": bool(args.profile_broker),
        },
        "load_average_start": os.getloadavg(),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "scenarios": {},
    }
    started = time.monotonic()
    temp_dir = None if args.log_dir else tempfile.mkdtemp(prefix="topiary-e2e-")
    log_dir = Path(args.log_dir or temp_dir)  # type: ignore[arg-type]
    log_dir.mkdir(parents=True, exist_ok=True)
    profile_dir = Path(args.profile_broker) if args.profile_broker else None
    failed = False
    print(
        f"e2e: {report['machine']['cpu_count']} CPUs, Python {report['machine']['python']}, "
        f"load average {' '.join(f'{x:.2f}' for x in report['load_average_start'])}"
        f"{' (quick)' if args.quick else ''}",
        flush=True,
    )
    try:
        for name in args.names:
            print(f"  running {name} ...", flush=True)
            if name == SUBSCRIBE_SCENARIO:
                result = run_subscribe_scenario(params, args.seed, log_dir, profile_dir)
            elif name in DURABLE_SCENARIOS:
                result = run_durable_scenario(name, params, ctx, log_dir, profile_dir)
            else:
                result = run_publish_scenario(name, params, args.seed, ctx, log_dir, profile_dir)
            if "error" in result:
                failed = True
                print(f"  {name} failed: {result['error']}", file=sys.stderr, flush=True)
            report["scenarios"][name] = result
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
    report["load_average_end"] = os.getloadavg()
    report["elapsed_seconds"] = time.monotonic() - started
    report["goals"] = check_goals(report)
    report["notes"] = notes(report)

    print()
    for line in table_lines(report["scenarios"]):
        print(line)
    if SUBSCRIBE_SCENARIO in report["scenarios"]:
        print(subscribe_line(report["scenarios"][SUBSCRIBE_SCENARIO]))
    durable = durable_lines(report["scenarios"])
    if durable:
        print()
        for line in durable:
            print(line)
    print()
    print(
        f"payload {PAYLOAD_SIZE} B; throughput phase: up to {params['throughput_max']:,} msgs "
        f"or {params['throughput_seconds']:g} s; latency phase: {params['latency_rate']:,} "
        f"msg/s for {params['latency_seconds']:g} s; dropped = broker 'dropped' counter "
        "(tput = throughput phase, lat = latency phase)"
    )
    for line in cpu_lines(report):
        print(line)
    print_ending(report, _goal_value)
    write_report(report, args.json)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
